package pace

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
)

// TestParseHoldMessage: what the hold script publishes (hold.lua), and
// what else may reach the channel, which is no hold; a hold of no length
// holds nothing.
func TestParseHoldMessage(t *testing.T) {
	for _, tc := range []struct {
		payload string
		key     string
		end     int64
		d       time.Duration
		ok      bool
	}{
		{"RULE|api.github.com:443|9f2c\n1700000060000000 60000000", "RULE|api.github.com:443|9f2c", 1700000060000000, time.Minute, true},
		{"k\n5 1", "k", 5, time.Microsecond, true},
		{"k\n5 0", "", 0, 0, false},
		{"k\n5 -1", "", 0, 0, false},
		{"k\n5 9223372036854776", "", 0, 0, false}, // beyond a Duration
		{"k\nretime 5", "", 0, 0, false},
		{"k\n5", "", 0, 0, false},
		{"k 5 1", "", 0, 0, false},
		{"k\n99999999999999999999 1", "", 0, 0, false},
		{"", "", 0, 0, false},
	} {
		key, end, d, ok := parseHoldMessage(tc.payload)
		if key != tc.key || end != tc.end || d != tc.d || ok != tc.ok {
			t.Errorf("parseHoldMessage(%q) = %q, %d, %v, %v; want %q, %d, %v, %v", tc.payload, key, end, d, ok, tc.key, tc.end, tc.d, tc.ok)
		}
	}
}

// FuzzParseHoldMessage: any payload parses or not, without a panic, and a
// hold parsed lasts a while.
func FuzzParseHoldMessage(f *testing.F) {
	f.Add("k\n5 1")
	f.Add("k\nrate 5")
	f.Fuzz(func(t *testing.T, payload string) {
		if _, _, d, ok := parseHoldMessage(payload); ok && d <= 0 {
			t.Errorf("%q: a hold of %v", payload, d)
		}
	})
}

// TestHoldStopsSleepers: callers already booked and asleep when a hold
// comes do not go during the hold, on Local as on Redis.
func TestHoldStopsSleepers(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for name, newLimiter := range map[string]func(Observer) backend{
		"redis": func(o Observer) backend { return mustRedis(t, c, PerSecond(20).WithBurst(1), WithObserver(o)) },
		"local": func(o Observer) backend { return mustLocal(t, PerSecond(20).WithBurst(1), WithObserver(o)) },
	} {
		t.Run(name, func(t *testing.T) {
			booked := make(chan time.Duration, 8)
			lim := newLimiter(func(_ context.Context, e Event) {
				if e.Kind == EventWait {
					booked <- e.Delay
				}
			})
			lim.Wait(ctx, "k", 1) // empty the bucket
			<-booked
			done := make(chan time.Time, 3)
			for range 3 { // asleep for 50, 100 and 150 ms
				go func() {
					lim.Wait(ctx, "k", 1)
					done <- time.Now()
				}()
			}
			for range 3 {
				if d := <-booked; d == 0 {
					t.Fatal("a caller was not put to sleep")
				}
			}
			held := time.Now()
			if err := lim.Hold(ctx, "k", headers.Hold{For: 400 * time.Millisecond, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if at := <-done; at.Sub(held) < 400*time.Millisecond {
					t.Errorf("a caller booked before the hold went %v after it, within the 400ms hold", at.Sub(held))
				}
			}
		})
	}
}

// TestHoldPausesKey: a hold makes the next wait for its key last the hold,
// on Redis for every limiter that shares it and on Local; a shorter hold
// does not shorten it; and the observer hears of it.
func TestHoldPausesKey(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for name, newLimiter := range map[string]func(Observer) backend{
		"redis": func(o Observer) backend { return mustRedis(t, c, PerSecond(100).WithBurst(5), WithObserver(o)) },
		"local": func(o Observer) backend { return mustLocal(t, PerSecond(100).WithBurst(5), WithObserver(o)) },
	} {
		t.Run(name, func(t *testing.T) {
			log := &eventLog{}
			lim := newLimiter(log.observe)
			h := headers.Hold{For: 300 * time.Millisecond, Reason: "429 Retry-After: 0.3"}
			if err := lim.Hold(ctx, "k", h); err != nil {
				t.Fatal(err)
			}
			if err := lim.Hold(ctx, "k", headers.Hold{For: 100 * time.Millisecond, Reason: "shorter"}); err != nil {
				t.Fatal(err)
			}
			if e, ok := log.last(EventHold); !ok || e.Reason != h.Reason || e.Delay != h.For {
				t.Errorf("last hold event %+v, want the 300ms hold alone (the shorter one changes nothing)", e)
			}
			var de *DeadlineError
			dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			if err := lim.Wait(dctx, "k", 1); !errors.As(err, &de) || de.Delay < 250*time.Millisecond || de.Delay > 300*time.Millisecond {
				t.Fatalf("Wait during the hold: %v, want a refusal of a wait of about 300ms", err)
			}
			if err := lim.Wait(ctx, "other", 1); err != nil {
				t.Fatalf("another key: %v", err)
			}
			if e, _ := log.last(EventWait); e.Key != "other" || e.Delay != 0 {
				t.Errorf("another key waited %v: a hold is for its own key alone", e.Delay)
			}
			start := time.Now()
			for range 3 { // the first at the hold's end, then one every 10 ms
				if err := lim.Wait(ctx, "k", 1); err != nil {
					t.Fatal(err)
				}
			}
			if took := time.Since(start); took < 250*time.Millisecond+20*time.Millisecond {
				t.Errorf("three waits after a hold of 300ms took %v, want the hold and then the rate, no burst", took)
			}
			for deadline := time.Now().Add(time.Second); ; { // the end is told by a timer of its own
				if e, ok := log.last(EventHoldEnd); ok {
					if e.Key != "k" || e.Reason != h.Reason {
						t.Errorf("hold end %+v, want key k and the hold's reason", e)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no EventHoldEnd within a second after the hold ended")
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}

// TestIgnoreHolds: an upstream that answers every request 429 with
// Retry-After: 5. A Transport that heeds holds refuses the next request at
// once (its wait would pass the caller's deadline of 1 s); with IgnoreHolds,
// or a Rule's for the path the request takes, the next goes within the
// deadline, on Local and Redis; a Rule's switch leaves the others' holds
// alone.
func TestIgnoreHolds(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer upstream.Close()
	limit := PerSecond(100).WithBurst(5)
	c := scriptRedis(t)
	for name, newLimiter := range map[string]func() Limiter{
		"local": func() Limiter { return mustLocal(t, limit) },
		"redis": func() Limiter {
			return mustRedis(t, c, limit, WithFleetSize(1), sharedOnly, WithPrefix("ignore-"+time.Now().Format("150405.000000")+":"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			rules := func(ignore bool) *Rules {
				rs, err := NewRules(Rule{Name: "default", Limiter: newLimiter()}, Rule{Name: "chat", PathPrefix: "/chat", Limiter: newLimiter(), IgnoreHolds: ignore})
				if err != nil {
					t.Fatal(err)
				}
				return rs
			}
			for _, row := range []struct {
				name      string
				transport *Transport
				path      string
				held      bool
			}{
				{"heeded", &Transport{Limiter: newLimiter()}, "/", true},
				{"Transport.IgnoreHolds", &Transport{Limiter: newLimiter(), IgnoreHolds: true}, "/", false},
				{"Rule.IgnoreHolds, its path", &Transport{Rules: rules(true)}, "/chat", false},
				{"Rule.IgnoreHolds, another path", &Transport{Rules: rules(true)}, "/other", true},
			} {
				client := &http.Client{Transport: row.transport}
				send := func(ctx context.Context) error {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+row.path, nil)
					resp, err := client.Do(req)
					if err == nil {
						resp.Body.Close()
					}
					return err
				}
				if err := send(context.Background()); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := send(ctx)
				cancel()
				var de *DeadlineError
				if held := errors.As(err, &de); held != row.held {
					t.Errorf("%s: the request after a 429 with Retry-After: 5: %v, want held %v", row.name, err, row.held)
				}
			}
		})
	}
}
