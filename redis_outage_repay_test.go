package pace

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
)

// TestRepayBounded: on a real Redis, a debt books what it owes under each
// kind of limit, and at most what the limit has free and one burst (a
// window's count) more, so that no outage can stop a key for longer than a
// refill period.
func TestRepayBounded(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for _, tc := range []struct {
		limit      Limit
		debt, want int
	}{
		{Per(100, time.Hour), 30, 30},
		{Per(100, time.Hour), 500, 200}, // free 100, and one burst beyond
		{Window(100, time.Hour), 30, 30},
		{Window(100, time.Hour), 500, 200},
		{FixedWindow(100, time.Hour), 30, 30},
		{FixedWindow(100, time.Hour), 500, 200}, // this window full, and the next
	} {
		t.Run(fmt.Sprintf("%v owes %d", tc.limit, tc.debt), func(t *testing.T) {
			r := mustRedis(t, c, tc.limit, WithPrefix(fmt.Sprintf("repay-%d-%d:", tc.limit.kind, tc.debt)), sharedOnly)
			took, err := storeOf(r).Repay(ctx, "k", store.LimitCosts{tc.debt})
			if err != nil {
				t.Fatal(err)
			}
			if took[0] != tc.want {
				t.Errorf("took %d units of a debt of %d, want %d", took[0], tc.debt, tc.want)
			}
			// What the debt took is spent: the bucket or window has
			// 100 - took left now (nothing, once the debt passes it).
			left := max(100-tc.want, 0)
			now, cancel := context.WithTimeout(ctx, time.Second) // a unit's refill takes 36 s
			defer cancel()
			for i := range left {
				if err := r.Wait(now, "k", 1); err != nil {
					t.Fatalf("grant %d of the %d left after the debt: %v", i+1, left, err)
				}
			}
			if err := r.Wait(now, "k", 1); err == nil {
				t.Errorf("a grant beyond the %d left after a debt of %d", left, tc.debt)
			}
			b, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			// Beyond what was free, the debt holds the key back by up to a
			// period more, no further.
			if lo, hi := time.Duration(tc.want-100)*36*time.Second*9/10, 2*time.Hour+time.Minute; b.Delay < lo || b.Delay > hi {
				t.Errorf("the next unit waits %v, want %v to %v", b.Delay, lo, hi)
			}
		})
	}
}

// TestLoneOutageRepays: one process of two loses its link to Redis while
// the other books the whole quota in Redis; back on Redis, the first books
// what it granted alone, so that over the run the fleet stays within its
// quota's b + r*t. The link comes back once the lone process has granted
// tenLocal alone, however long its breaker took to confirm the outage on
// this machine.
func TestLoneOutageRepays(t *testing.T) {
	besideOthers(t)
	ctx := context.Background()
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	// A quota of a period (as an hour's, shortened): its burst is the
	// period's count, so a lone outage's grants fit in its debt.
	const rate, burst, tenLocal = 20, 60, 10
	limit := Per(burst, burst/rate*time.Second)
	var repaid atomic.Int64
	observe := WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventRepay && e.Err == nil {
			repaid.Add(int64(e.Cost))
		}
	})
	opts := []Option{WithFleetSize(2), WithCooldown(50*time.Millisecond, 100*time.Millisecond)}
	lone := mustRedis(t, redistest.ClientOf(t, proxy.Addr), limit, append(opts, observe)...)
	other := mustRedis(t, srv.Client(t), limit, opts...)

	const run = 6 * time.Second
	start := time.Now()
	var mu sync.Mutex
	var grants, local int
	wentLocal := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range []*Redis{lone, other} {
		wg.Go(func() {
			for time.Since(start) < run {
				g, err := r.waitGrant(ctx, "k", 1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if time.Since(start) < run {
					grants++
					if g.booking.limiter == "local" {
						if local++; local == tenLocal {
							close(wentLocal)
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	proxy.SetLatency(3 * time.Second) // the lone process's calls time out
	select {
	case <-wentLocal:
	case <-time.After(run / 2):
	}
	proxy.SetLatency(0)
	wg.Wait()
	bound := burst + rate*run.Seconds()
	t.Logf("%d grants in %v (b + r*t = %.0f), %d of them local; %d units repaid", grants, run, bound, local, repaid.Load())
	if local < tenLocal {
		t.Fatalf("%d local grants in %v of a lost link: the lone process did not fall back", local, run/2)
	}
	if repaid.Load() < int64(local)*3/4 {
		t.Errorf("%d units repaid of %d granted locally", repaid.Load(), local)
	}
	if float64(grants) > bound+3 {
		t.Errorf("%d grants, beyond b + r*t = %.0f by more than 3", grants, bound)
	}
}
