package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestServeSlowReaderKeepsItsSlot: on a route capped at 1 in flight with a
// lease of 300 ms, a client that reads a byte of a 32 MB answer and then
// pauses for four leases holds the upstream's writes (the buffers between
// fill up); a second client's request, sent meanwhile, reaches the
// upstream only once the first answer has ended. Before, the first slot
// lapsed a lease into the pause (the proxy read nothing while its write to
// the client was blocked) and the upstream saw 2 in flight under a cap of 1.
func TestServeSlowReaderKeepsItsSlot(t *testing.T) {
	const lease, size = 300 * time.Millisecond, 32 << 20
	var (
		mu    sync.Mutex
		spans = map[string][2]time.Time{}
	)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, start := r.URL.Path, time.Now()
		chunk := make([]byte, 64<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				break
			}
		}
		mu.Lock()
		spans[who] = [2]time.Time{start, time.Now()}
		mu.Unlock()
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: capped, upstream: '%s', limit: 100/s, in_flight: 1, lease: %v}\n", redisServer.Addr, upstream.URL, lease))

	slow, err := http.Get(base + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(slow.Body, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		resp, err := http.Get(base + "/second")
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		second <- err
	}()
	time.Sleep(4 * lease) // the pause: nothing read
	if _, err := io.Copy(io.Discard, slow.Body); err != nil {
		t.Fatal(err)
	}
	slow.Body.Close()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	first, next := spans["/slow"], spans["/second"]
	t.Logf("the slow answer at the upstream from 0 to %v, the second's from %v", first[1].Sub(first[0]), next[0].Sub(first[0]))
	if first[1].Sub(first[0]) < 3*lease {
		t.Fatalf("the slow answer took %v at the upstream: the pause did not hold its writes (want %v or more)", first[1].Sub(first[0]), 3*lease)
	}
	if next[0].Before(first[1]) {
		t.Errorf("the second request reached the upstream %v before the slow answer ended: 2 in flight under a cap of 1", first[1].Sub(next[0]))
	}
}
