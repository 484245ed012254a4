package pace

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
)

// TestTokenLeasesOnRedis: four processes, each its own client and limiter,
// wait on one hot key of a real redis-server. Their grants stay within
// b + r*t of the time from the first wait to the last grant, and they take
// their tokens by leases: a script call for every 4 grants at most (one a
// grant without them).
func TestTokenLeasesOnRedis(t *testing.T) {
	ctx := context.Background()
	server := redistest.Start(t)
	admin := server.Client(t)
	const procs, workers, rate, burst = 4, 6, 20000, 400
	limit := PerSecond(rate).WithBurst(burst)
	var limiters []*Redis
	for range procs {
		limiters = append(limiters, mustRedis(t, server.Client(t), limit, WithProcess(NewProcess()), WithFleetSize(procs), sharedOnly))
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var grants atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(time.Second)
	for _, l := range limiters {
		for range workers {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := l.Wait(ctx, "hot", 1); err != nil {
						t.Error(err)
						return
					}
					grants.Add(1)
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	stats, err := redistest.CommandStats(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	calls, granted := redistest.ScriptCalls(stats), grants.Load()
	t.Logf("%d grants in %v, %d script calls", granted, elapsed, calls)
	if bound := burst + rate*elapsed.Seconds(); float64(granted) > bound {
		t.Errorf("%d grants in %v: beyond b + r*t = %.0f", granted, elapsed, bound)
	}
	if calls*4 > granted {
		t.Errorf("%d script calls for %d grants: want a call for every 4 grants at most (leases)", calls, granted)
	}
}

// TestTokenLeasesServeOrStepAside, on one process: a key waited on often
// takes its tokens by leases (a script call for many waits); a wait of
// more than a lease holds books in Redis, one call; a
// key whose leases WithTokenLeases turned off makes a call a wait.
func TestTokenLeasesServeOrStepAside(t *testing.T) {
	ctx := context.Background()
	for _, leases := range []bool{true, false} {
		c := scriptRedis(t)
		scripts := &store.ScriptCounter{}
		c.AddHook(scripts)
		r := mustRedis(t, c, PerSecond(1e6).WithBurst(100000), WithFleetSize(1), WithTokenLeases(leases), sharedOnly)
		waits := func(n, cost int) int64 {
			before := scripts.Calls.Load()
			for range n {
				if err := r.Wait(ctx, "k", cost); err != nil {
					t.Fatal(err)
				}
			}
			return scripts.Calls.Load() - before
		}
		waits(200, 1) // the key's demand, counted
		calls := waits(1000, 1)
		big := waits(1, 50000)
		t.Logf("leases %v: 1,000 waits made %d script calls; a wait of 50,000 made %d", leases, calls, big)
		switch {
		case leases && (calls > 1000/leaseMinTokens || big != 1):
			t.Errorf("with leases: %d script calls for 1,000 waits, %d for a wait of 50,000; want at most %d, and one", calls, big, 1000/leaseMinTokens)
		case !leases && (calls != 1000 || big != 1):
			t.Errorf("without leases: %d script calls for 1,000 waits, %d for a wait of 50,000; want one a wait", calls, big)
		}
	}
}
