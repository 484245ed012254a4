"""A client of pace serve's wait endpoint, with Python's standard library
alone: work that does not pass through the proxy (a Scrapy downloader
middleware, a Celery task) waits there for its turn under a route's quota.

    from pace_wait import wait

    wait("http://127.0.0.1:8080", route="github", cost=1, timeout=30)

wait returns the seconds it waited once granted, and raises TooLong, which
carries retry_after (the wait it would have had), when the wait would pass
timeout; nothing is booked then. Any other answer raises WaitError.
"""
import json
import urllib.error
import urllib.request

__all__ = ["wait", "TooLong", "WaitError"]


class WaitError(Exception):
    """pace serve refused the wait: a bad request, an unknown route."""


class TooLong(WaitError):
    """The wait would pass its timeout; retry_after is the wait, in seconds."""

    def __init__(self, message, retry_after):
        super().__init__(message)
        self.retry_after = retry_after


def wait(base_url, route="", key="", cost=1, timeout=0):
    """Waits until pace serve at base_url grants cost on key (by default,
    the key of the route's proxied requests), for at most timeout seconds
    (0: the route's max_wait)."""
    body = json.dumps({"route": route, "key": key, "cost": cost, "timeout_ms": int(timeout * 1000)}).encode()
    request = urllib.request.Request(base_url.rstrip("/") + "/pace/v1/wait", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        # The answer comes once granted: the socket waits as long as the wait may.
        with urllib.request.urlopen(request, timeout=(timeout or 3600) + 30) as resp:
            return json.load(resp)["waited_ms"] / 1000
    except urllib.error.HTTPError as err:
        try:
            reply = json.load(err)
        except ValueError:
            reply = {}
        message = reply.get("error", "HTTP %d" % err.code)
        if err.code == 429:
            raise TooLong(message, reply.get("retry_after_ms", 0) / 1000) from None
        raise WaitError(message) from None


if __name__ == "__main__":
    # python3 pace_wait.py BASE_URL ROUTE N COST: waits N times, printing a
    # JSON line of what each wait gave (its granted time, or its retry_after).
    import sys
    import time
    base, route, n, cost = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for _ in range(n):
        try:
            wait(base, route=route, cost=cost, timeout=5)
            print(json.dumps({"granted": time.time()}), flush=True)
        except TooLong as err:
            print(json.dumps({"retry_after": err.retry_after}), flush=True)
