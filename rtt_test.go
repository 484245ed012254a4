package pace

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRoundTripsSetTheTimeout: the call timeout from the round trips
// measured, with a floor of 50 ms (or another), on plain samples.
func TestRoundTripsSetTheTimeout(t *testing.T) {
	const ms = time.Millisecond
	for name, tc := range map[string]struct {
		floor time.Duration
		play  func(r *roundTrips)
		least time.Duration
		most  time.Duration
	}{
		"none measured: the ceiling": {50 * ms, func(*roundTrips) {}, time.Second, time.Second},
		"loopback: the floor": {50 * ms, func(r *roundTrips) {
			for range 20 {
				r.answered(100 * time.Microsecond)
			}
		}, 50 * ms, 50*ms + ms},
		"the first of 80 ms: three of it, and four times its deviation of 40 ms": {50 * ms, func(r *roundTrips) { r.answered(80 * ms) }, 400 * ms, 400 * ms},
		"80 ms steadily: three of it, and the floor": {50 * ms, func(r *roundTrips) {
			for range 100 {
				r.answered(80 * ms)
			}
		}, 290 * ms, 291 * ms},
		"a loaded machine, 20 to 60 ms: above the slowest": {50 * ms, func(r *roundTrips) {
			for i := range 200 {
				r.answered(time.Duration(20+40*(i%2)) * ms)
			}
		}, 150 * ms, 260 * ms},
		"a sample beyond the ceiling counts as the ceiling": {50 * ms, func(r *roundTrips) { r.answered(time.Hour) }, time.Second, time.Second},
		"a floor above the ceiling: the floor":              {5 * time.Second, func(r *roundTrips) { r.answered(ms) }, 5 * time.Second, 5 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			r := &roundTrips{floor: tc.floor}
			tc.play(r)
			if got := r.timeout(); got < tc.least || got > tc.most {
				t.Errorf("timeout %v, want %v to %v", got, tc.least, tc.most)
			}
		})
	}
}

// TestSlowLinkIsNotAnOutage: three limiters of 100/s burst 5 on one key,
// with default options, 4 goroutines each for 4 s; one reaches Redis
// through 40 ms of latency each way (a Redis in another zone). A Redis
// that answers in 80 ms is slow, not away: no limiter falls back, and the
// fleet's busiest second holds b + r (and 5%).
func TestSlowLinkIsNotAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	proxy.SetLatency(40 * time.Millisecond)
	var mu sync.Mutex
	var grants []time.Time
	fallbacks := 0
	observe := func(_ context.Context, e Event) {
		if e.Kind == EventFallback {
			mu.Lock()
			fallbacks++
			mu.Unlock()
			t.Logf("fallback: %v", e.Err)
		}
	}
	end := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for _, addr := range []string{srv.Addr, srv.Addr, proxy.Addr} {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		r := mustRedis(t, c, PerSecond(100).WithBurst(5), WithObserver(observe))
		for range 4 {
			wg.Go(func() {
				for {
					ctx, cancel := context.WithDeadline(context.Background(), end)
					err := r.Wait(ctx, "slow-link", 1)
					cancel()
					if err != nil {
						return
					}
					mu.Lock()
					grants = append(grants, time.Now())
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(grants, time.Time.Compare)
	busiest := 0
	for i, j := 0, 0; j < len(grants); j++ {
		for grants[j].Sub(grants[i]) >= time.Second {
			i++
		}
		busiest = max(busiest, j-i+1)
	}
	t.Logf("%d grants in 4 s, the busiest second %d, %d fallbacks", len(grants), busiest, fallbacks)
	if fallbacks > 0 || float64(busiest) > 1.05*(5+100) {
		t.Errorf("%d fallbacks, the busiest second %d; want none, and at most b + r = 105 (and 5%%)", fallbacks, busiest)
	}
}
