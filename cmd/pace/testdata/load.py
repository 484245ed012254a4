"""Sends GET requests to the URLs given, from a number of threads, for a
number of seconds, with the standard library alone, and prints one JSON
line: the count of each status and the span of the run.

    python3 load.py SECONDS THREADS URL [URL...]

Thread i sends to URL i mod the count of URLs, on one connection that it
keeps open (HTTP/1.1 keep-alive). With PACE_LOAD_START set
(a Unix time, in seconds), the threads start then (or at once, if it has
passed): processes started together begin together, however long each
took to start.
"""
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

seconds, threads, urls = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
counts, lock = {}, threading.Lock()
start = max(float(os.environ.get("PACE_LOAD_START", 0)), time.time())
time.sleep(max(start - time.time(), 0))
ends = []


def send(url):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    last = start
    while time.time() < start + seconds:
        try:
            conn.request("GET", parts.path or "/")
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (http.client.HTTPException, OSError) as err:
            conn.close()  # it reconnects at the next request
            status = type(err).__name__
        last = time.time()
        with lock:
            counts[str(status)] = counts.get(str(status), 0) + 1
    conn.close()
    with lock:
        ends.append(last)


workers = [threading.Thread(target=send, args=(urls[i % len(urls)],)) for i in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print(json.dumps({"counts": counts, "start": start, "end": max(ends)}))
