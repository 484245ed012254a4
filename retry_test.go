package pace

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// TestRetryClientReplaysAndHolds: a POST with a body against an upstream
// that answers 429 (Retry-After: 1) twice, then 201. The body arrives whole
// three times, each attempt pays its token, and the whole takes the two
// holds and the pacing, not backoff on top of the holds.
func TestRetryClientReplaysAndHolds(t *testing.T) {
	besideOthers(t)
	var mu sync.Mutex
	var bodies []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(body))
		n := len(bodies)
		mu.Unlock()
		if n <= 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()

	log := &eventLog{}
	limiter := mustRedis(t, newTestRedis(t), PerSecond(10), WithObserver(log.observe))
	transport := &Transport{Limiter: limiter}
	defer transport.CloseIdleConnections()
	client := NewRetryClient(transport)

	const payload = `{"order": 42, "items": ["a", "b"]}`
	req, err := retryablehttp.NewRequest(http.MethodPost, api.URL+"/orders", bytes.NewBufferString(payload))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := client.Do(req)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	if len(bodies) != 3 {
		t.Fatalf("%d attempts reached the upstream, want 3", len(bodies))
	}
	for i, b := range bodies {
		if b != payload {
			t.Errorf("attempt %d: body %q, want %q", i, b, payload)
		}
	}
	waits, holds := 0, 0
	log.mu.Lock()
	for _, e := range log.events {
		switch e.Kind {
		case EventWait:
			waits++
		case EventHold:
			holds++
		}
	}
	log.mu.Unlock()
	if waits != 3 || holds != 2 {
		t.Errorf("%d bookings and %d holds, want one booking per attempt (3) and a hold per 429 (2)", waits, holds)
	}
	// Two holds of 1 s: 2 s. Backoff on top would add retryablehttp's own
	// wait for Retry-After, another second each.
	t.Logf("three attempts took %v", took)
	if took < 2*time.Second || took > 2*time.Second+500*time.Millisecond {
		t.Errorf("three attempts took %v, want the two 1s holds plus pacing, not backoff on top", took)
	}
}

// TestRetryClientRetriesRateLimitForbiddens: GitHub's secondary limit is a
// 403 with Retry-After, its primary one a 403 with X-RateLimit-Remaining:
// 0 and its reset (1 to 2 s ahead, in whole seconds); both are retried
// once the hold they set has passed
// (neither was retried), and a plain 403 is not.
func TestRetryClientRetriesRateLimitForbiddens(t *testing.T) {
	besideOthers(t)
	for name, tc := range map[string]struct {
		header   http.Header
		attempts int32
		want     int
	}{
		"secondary limit": {http.Header{"Retry-After": {"1"}}, 2, http.StatusOK},
		"primary limit":   {http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"RESET"}}, 2, http.StatusOK},
		"plain 403":       {http.Header{}, 1, http.StatusForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var attempts atomic.Int32
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if attempts.Add(1) == 1 {
					for k, v := range tc.header {
						w.Header().Set(k, strings.ReplaceAll(v[0], "RESET", strconv.FormatInt(time.Now().Add(2*time.Second).Unix(), 10)))
					}
					w.WriteHeader(http.StatusForbidden)
					return
				}
				w.WriteHeader(http.StatusOK)
			}))
			defer api.Close()
			transport := &Transport{Limiter: mustLocal(t, PerSecond(10))}
			defer transport.CloseIdleConnections()
			start := time.Now()
			resp, err := NewRetryClient(transport).Get(api.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want || attempts.Load() != tc.attempts {
				t.Errorf("%d after %d attempts, want %d after %d", resp.StatusCode, attempts.Load(), tc.want, tc.attempts)
			}
			if took := time.Since(start); tc.attempts == 2 && took < 900*time.Millisecond {
				t.Errorf("the retry came %v after the first attempt, want after the hold of about a second", took)
			}
		})
	}
}

// TestRetryClientDoesNotRetryRefusals: a wait that pace refused fails at
// once, without retries.
func TestRetryClientDoesNotRetryRefusals(t *testing.T) {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer api.Close()
	transport := &Transport{Limiter: mustLocal(t, Every(time.Hour)), Cost: func(*http.Request) int { return 2 }}
	defer transport.CloseIdleConnections()
	start := time.Now()
	_, err := NewRetryClient(transport).Get(api.URL)
	if err == nil || !strings.Contains(err.Error(), "exceeds the burst") || calls.Load() != 0 {
		t.Errorf("Get with an impossible cost: %v, %d calls", err, calls.Load())
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("an impossible wait took %v to fail: it was retried", took)
	}
	var de *DeadlineError
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	transport.Cost = nil
	transport.Limiter.Wait(ctx, HostKey(mustRequest(t, api.URL)), 1) // the only token of the hour
	req, _ := retryablehttp.NewRequestWithContext(ctx, http.MethodGet, api.URL, nil)
	if _, err := NewRetryClient(transport).Do(req); !errors.As(err, &de) {
		t.Errorf("Get that would wait an hour under a 1s deadline: %v, want a *DeadlineError", err)
	}
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestTransportHolds: a huge Retry-After is capped at the limiter's
// MaxHold and reported; a garbage one changes nothing.
func TestTransportHolds(t *testing.T) {
	header := make(chan [2]string, 1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := <-header
		w.Header().Set(h[0], h[1])
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer api.Close()
	log := &eventLog{}
	limiter := mustRedis(t, newTestRedis(t), PerSecond(100), WithObserver(log.observe), WithMaxHold(300*time.Millisecond))
	transport := &Transport{Limiter: limiter}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	get := func(name, value string) time.Duration {
		t.Helper()
		header <- [2]string{name, value}
		start := time.Now()
		resp, err := client.Get(api.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return time.Since(start)
	}

	get("Retry-After", "soon")
	get("X-RateLimit-Remaining", "-3")
	if e, ok := log.last(EventHold); ok {
		t.Fatalf("garbage headers set a hold: %+v", e)
	}
	if took := get("Retry-After", "0"); took > 100*time.Millisecond {
		t.Errorf("after garbage headers a request waited %v", took)
	}

	get("Retry-After", "1743440400") // 484,289 hours
	capped, ok := log.last(EventHoldCapped)
	if !ok || capped.Delay < 484289*time.Hour {
		t.Errorf("capped hold reported as %+v, want what was asked, 484289h", capped)
	}
	if hold, _ := log.last(EventHold); hold.Delay != 300*time.Millisecond {
		t.Errorf("hold of %v, want the cap of 300ms", hold.Delay)
	}
	if took := get("Retry-After", "0"); took < 250*time.Millisecond || took > 400*time.Millisecond {
		t.Errorf("the next request waited %v, want the 300ms cap", took)
	}
}
