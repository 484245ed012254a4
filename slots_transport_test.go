package pace

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// slowBody answers with 4 chunks, 80 ms apart.
func slowBody(w http.ResponseWriter, _ *http.Request) {
	for range 4 {
		w.Write([]byte("chunk\n"))
		w.(http.Flusher).Flush()
		time.Sleep(80 * time.Millisecond)
	}
}

// failing is a Base that fails every request.
type failing struct{}

func (failing) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused")
}

// TestSlotLivesWithTheBody: through a Transport, a request holds its slot
// of a cap of 1 until its body ends: while its body is read slowly nobody
// else gets the slot; it is freed at EOF, on Close, and when the Base
// fails; a body never closed and left idle is freed when its lease lapses,
// and the observer hears of it, unless its caller said it always closes it
// (WithBodyAlwaysClosed, as a proxy before a slow client does): then it
// holds the slot, idle, past two leases, until it closes.
func TestSlotLivesWithTheBody(t *testing.T) {
	besideOthers(t)
	const lease = 300 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(slowBody))
	defer srv.Close()
	var mu sync.Mutex
	var heard []EventKind
	r := mustRedis(t, newTestRedis(t), Concurrent(1), WithFleetSize(1), WithLease(lease), WithObserver(func(_ context.Context, e Event) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, e.Kind)
	}))
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: &Transport{Base: base, Limiter: r}}
	get := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		return client.Do(req)
	}
	// nextWithin asserts that a second request gets the slot within d (and
	// not before at least, when given), and returns how long it waited.
	nextWithin := func(t *testing.T, at, d time.Duration) time.Duration {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		resp, err := get(ctx)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("the next request: %v after %v, want the slot within %v", err, took, d)
		}
		resp.Body.Close()
		if took < at {
			t.Errorf("the next request got the slot after %v, want not before %v", took, at)
		}
		return took
	}

	t.Run("read slowly, then EOF", func(t *testing.T) {
		resp, err := get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		if other, err := get(ctx); err == nil {
			other.Body.Close()
			t.Error("a second request got a slot while the first body was being read")
		}
		cancel()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		nextWithin(t, 0, 100*time.Millisecond) // freed at EOF, before Close
		resp.Body.Close()
	})
	t.Run("Close", func(t *testing.T) {
		resp, err := get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		nextWithin(t, 0, 100*time.Millisecond)
	})
	t.Run("the Base fails", func(t *testing.T) {
		failed := &http.Client{Transport: &Transport{Base: failing{}, Limiter: r}}
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if _, err := failed.Do(req); err == nil {
			t.Fatal("want the Base's error")
		}
		nextWithin(t, 0, 100*time.Millisecond)
	})
	t.Run("never closed", func(t *testing.T) {
		mu.Lock()
		heard = nil
		mu.Unlock()
		left, err := get(context.Background()) // its body is left as it is, until the end
		if err != nil {
			t.Fatal(err)
		}
		defer left.Body.Close()
		took := nextWithin(t, lease, 3*lease)
		t.Logf("a body never closed freed its slot after %v (lease %v)", took, lease)
		mu.Lock()
		defer mu.Unlock()
		var abandoned, expired bool
		for _, k := range heard {
			abandoned = abandoned || k == EventSlotAbandon
			expired = expired || k == EventSlotExpire
		}
		if !abandoned || !expired {
			t.Errorf("heard %v, want slot-abandon and slot-expire", heard)
		}
	})
	t.Run("idle, but always closed", func(t *testing.T) {
		held, err := get(WithBodyAlwaysClosed(context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*lease)
		defer cancel()
		if other, err := get(ctx); err == nil {
			other.Body.Close()
			t.Errorf("a second request got the slot of an idle body whose caller always closes it")
		}
		held.Body.Close()
		nextWithin(t, 0, 100*time.Millisecond)
	})
}

// panicking is a Base that panics, as a user's RoundTripper may.
type panicking struct{}

func (panicking) RoundTrip(*http.Request) (*http.Response, error) { panic("a bug in the Base") }

// TestSlotFreedOnPanic: a Base or an Estimate that panics, whose caller
// recovers, frees the request's slot of a cap of 2 on a real redis-server:
// after 5 such requests of each, both slots are free.
func TestSlotFreedOnPanic(t *testing.T) {
	r := mustRedis(t, newTestRedis(t), AllOf(Concurrent(2), PerSecond(1000)), WithFleetSize(1))
	for name, tr := range map[string]*Transport{
		"Base":     {Base: panicking{}, Limiter: r},
		"Estimate": {Base: failing{}, Limiter: r, Estimate: func(*http.Request) Costs { panic("a bug in the Estimate") }},
	} {
		t.Run(name, func(t *testing.T) {
			for i := range 5 {
				func() {
					ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
					defer cancel()
					var err error
					defer func() {
						if recover() == nil {
							t.Fatalf("request %d did not panic: %v (a slot leaked?)", i, err)
						}
					}()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.example.com/", nil)
					_, err = tr.RoundTrip(req)
				}()
			}
			for i := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				slot, err := r.Acquire(ctx, "api.example.com:80", 1)
				cancel()
				if err != nil {
					t.Fatalf("slot %d of 2 after 5 panics: %v", i+1, err)
				}
				defer slot.Release()
			}
		})
	}
}
