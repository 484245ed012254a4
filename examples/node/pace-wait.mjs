// A client of pace serve's wait endpoint, with Node's standard library
// alone (its fetch): work that does not pass through the proxy waits there
// for its turn under a route's quota.
//
//     import { wait } from "./pace-wait.mjs";
//     await wait("http://127.0.0.1:8080", { route: "github", cost: 1, timeout: 30 });
//
// wait resolves to the seconds it waited once granted, and rejects with a
// TooLong, which carries retryAfter (the wait it would have had, in
// seconds), when the wait would pass timeout; nothing is booked then. Any
// other answer rejects with a WaitError.

export class WaitError extends Error {}

export class TooLong extends WaitError {
  constructor(message, retryAfter) {
    super(message);
    this.retryAfter = retryAfter;
  }
}

export async function wait(baseURL, { route = "", key = "", cost = 1, timeout = 0 } = {}) {
  const resp = await fetch(baseURL.replace(/\/$/, "") + "/pace/v1/wait", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ route, key, cost, timeout_ms: Math.round(timeout * 1000) }),
  });
  const reply = await resp.json().catch(() => ({}));
  if (resp.ok) {
    return reply.waited_ms / 1000;
  }
  const message = reply.error ?? `HTTP ${resp.status}`;
  if (resp.status === 429) {
    throw new TooLong(message, (reply.retry_after_ms ?? 0) / 1000);
  }
  throw new WaitError(message);
}

// node pace-wait.mjs BASE_URL ROUTE N COST: waits N times, printing a JSON
// line of what each wait gave (its granted time, or its retryAfter).
if (import.meta.url === `file://${process.argv[1]}`) {
  const [base, route, n, cost] = [process.argv[2], process.argv[3], Number(process.argv[4]), Number(process.argv[5])];
  for (let i = 0; i < n; i++) {
    try {
      await wait(base, { route, cost, timeout: 5 });
      console.log(JSON.stringify({ granted: Date.now() / 1000 }));
    } catch (err) {
      if (!(err instanceof TooLong)) throw err;
      console.log(JSON.stringify({ retry_after: err.retryAfter }));
    }
  }
}
