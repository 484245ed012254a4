package pace

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// TestTokenLeasesOnRedis: four processes, each its own client and
// limiter, wait on one hot key of a real redis-server for a second. Their
// grants stay within b + r*t of the time from the first wait to the last
// grant, and they take their tokens by leases: a script call for every 4
// grants at most (one a grant without them).
func TestTokenLeasesOnRedis(t *testing.T) {
	ctx := context.Background()
	server := redistest.Start(t)
	const procs, workers, rate, burst = 4, 6, 20000, 400
	limit := PerSecond(rate).WithBurst(burst)
	var limiters []*Redis
	scripts := &store.ScriptCounter{}
	for range procs {
		c := server.Client(t)
		c.AddHook(scripts)
		limiters = append(limiters, mustRedis(t, c, limit, WithProcess(NewProcess()), WithFleetSize(procs), sharedOnly))
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
	for _, l := range limiters {
		l.tokens.refills.Wait() // a lease prefetched is these waits' call
	}
	calls, granted := scripts.Calls.Load(), grants.Load()
	t.Logf("%d grants in %v, %d script calls", granted, elapsed, calls)
	if bound := burst + rate*elapsed.Seconds(); float64(granted) > bound {
		t.Errorf("%d grants in %v: beyond b + r*t = %.0f", granted, elapsed, bound)
	}
	if calls*4 > granted {
		t.Errorf("%d script calls for %d grants: want a call for every 4 grants at most (leases)", calls, granted)
	}
}

// hotRedis is a Redis limiter of q on c, one process of its fleet, whose
// clock stands still: however slow the machine (the race detector, a CPU
// hog), its waits come all at once, as a hot key's do.
func hotRedis(t *testing.T, c redis.UniversalClient, q Quota, opts ...Option) *Redis {
	t.Helper()
	clock := &fakeClock{now: time.Now()}
	r, err := newRedisOn(c, q, clock.Now, append([]Option{WithFleetSize(1), sharedOnly}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestTokenLeasesServeOrStepAside, on one process (and on a Cluster: see
// TestOnCluster).
func TestTokenLeasesServeOrStepAside(t *testing.T) {
	for _, leases := range []bool{true, false} {
		checkLeasesServe(t, scriptRedis(t), leases)
	}
}

// checkLeasesServe, on one process over c: a key waited on often takes
// its tokens by leases (a script call for many waits); a wait of more
// than a lease holds books in Redis, one call; a key whose leases
// WithTokenLeases turned off makes a call a wait.
func checkLeasesServe(t *testing.T, c redis.UniversalClient, leases bool) {
	ctx := context.Background()
	scripts := &store.ScriptCounter{}
	c.AddHook(scripts)
	r := hotRedis(t, c, PerSecond(1e6).WithBurst(100000), WithTokenLeases(leases))
	waits := func(n, cost int) int64 {
		before := scripts.Calls.Load()
		for range n {
			if err := r.Wait(ctx, "k", cost); err != nil {
				t.Fatal(err)
			}
		}
		r.tokens.refills.Wait() // a lease prefetched is these waits' call
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

// TestLeasedWaitKeepsItsPromises, on a lease that begins 50 ms ahead (a
// drained bucket's): a wait whose budget ends before the lease begins
// books in Redis at once (the deadline fails fast there, not after a
// sleep), and a wait whose context ends while it sleeps returns at once
// with the context's cause and an EventCancel; neither spends a leased
// token.
func TestLeasedWaitKeepsItsPromises(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFailoverTestOn(t, PerSecond(10000).WithBurst(1000), 1, nil, time.Now)
		for range demandHot { // the key's demand, counted
			if err := f.r.Wait(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
		}
		v, ok := f.r.tokens.keys.Load("k")
		if !ok {
			t.Fatal("the key's demand, not counted")
		}
		start := time.Now()
		l := &tokenLease{size: 40, begin: start.Add(50 * time.Millisecond), end: start.Add(70 * time.Millisecond), arrived: start}
		l.left.Store(40)
		v.(*keyLeases).cur.Store(l)
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		if err := f.r.Wait(short, "k", 1); err != nil || time.Since(start) != 0 {
			t.Errorf("a wait of budget 10 ms, the lease 50 ms ahead: %v after %v; want it booked in Redis at once", err, time.Since(start))
		}
		ending, cancel := context.WithCancel(ctx)
		time.AfterFunc(10*time.Millisecond, cancel)
		err := f.r.Wait(ending, "k", 1)
		e, _ := f.log.last(EventCancel)
		if !errors.Is(err, context.Canceled) || time.Since(start) != 10*time.Millisecond || e.Key != "k" {
			t.Errorf("a wait cancelled after 10 ms of sleep: %v after %v, last cancel event %+v; want context.Canceled then, and the event", err, time.Since(start), e)
		}
		if left := l.left.Load(); left != 40 {
			t.Errorf("%d of the lease's 40 tokens left after both; want all", left)
		}
		if err := f.r.Wait(ctx, "k", 1); err != nil || time.Since(start) != 50*time.Millisecond || l.left.Load() != 39 {
			t.Errorf("a wait on the lease: %v after %v, %d tokens left; want a token at its beginning, 50 ms", err, time.Since(start), l.left.Load())
		}
	})
}

// TestRefusalOfALeasedTokenTeaches: a refusal of a request whose token
// came from a lease weighs in the key's rate, as one of a request booked
// alone does (the rate opens at the first: lua/refused.lua), and the key
// books one request at a time from then on.
func TestRefusalOfALeasedTokenTeaches(t *testing.T) {
	ctx := context.Background()
	c := scriptRedis(t)
	r := hotRedis(t, c, PerSecond(1e6).WithBurst(100000))
	var g grant
	for range 2 * demandHot {
		var err error
		if g, err = r.waitGrant(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	if !g.leased {
		t.Fatalf("after %d waits, a grant not leased: %+v", 2*demandHot, g)
	}
	r.heed(ctx, "k", g, headers.Word{Status: http.StatusTooManyRequests, Refused: true, At: time.Now()}, heedScope{holds: true, counters: true, refusals: true})
	if n, err := c.Exists(ctx, "pace:{k}#rate").Result(); err != nil || n != 1 {
		t.Errorf("after a leased token's refusal, the key's rate: %d, %v; want it there", n, err)
	}
	if g, err := r.waitGrant(ctx, "k", 1); err != nil || g.leased {
		t.Errorf("the wait after the refusal: leased %v, %v; want it booked in Redis", g.leased, err)
	}
}

// TestTokenLeasesForgetIdleKeys: keys that were hot once, then idle for
// leaseIdle, are forgotten at the next wait: a process keeps no memory for
// them.
func TestTokenLeasesForgetIdleKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFailoverTestOn(t, PerSecond(1e5).WithBurst(10000), 1, nil, time.Now)
		const keys = 50
		for i := range keys {
			for range demandHot {
				if err := f.r.Wait(ctx, strconv.Itoa(i), 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		hot := func() (n int) {
			f.r.tokens.keys.Range(func(any, any) bool { n++; return true })
			return n
		}
		if n := hot(); n != keys {
			t.Fatalf("%d keys with leases after %d were waited on often; want all", n, keys)
		}
		time.Sleep(2 * leaseIdle)
		if err := f.r.Wait(ctx, "another", 1); err != nil {
			t.Fatal(err)
		}
		if n := hot(); n != 0 {
			t.Errorf("%d keys with leases %v after the last wait on them; want none", n, 2*leaseIdle)
		}
	})
}

// TestTokenLeasesAllowForASlowLink: over a link whose round trip (50 ms)
// outlasts a lease's span (40 ms), the first lease's reply comes too late
// to hand any token out: its tokens lapse, and the next lease asks for a
// span of two round trips, whose tokens go.
func TestTokenLeasesAllowForASlowLink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFailoverTestOn(t, PerSecond(1e4).WithBurst(10000), 1, nil, time.Now)
		var spans []time.Duration
		f.store.leases = func(n int64, span time.Duration) store.TokenLease {
			spans = append(spans, span)
			time.Sleep(50 * time.Millisecond) // the round trip
			return store.TokenLease{Tokens: n, End: span, Now: time.Now().UnixMicro()}
		}
		leased := 0
		for range demandHot + 100 {
			g, err := f.r.waitGrant(ctx, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if g.leased {
				leased++
			}
			time.Sleep(time.Millisecond)
		}
		if len(spans) < 2 || spans[0] != 2*leasePeriod || spans[1] != 100*time.Millisecond || leased == 0 {
			t.Errorf("spans asked %v, %d waits leased; want %v then 100ms, and the second's tokens handed out", spans, leased, 2*leasePeriod)
		}
	})
}

// TestOutageSpendsTheLeaseInHand: once an outage begins, a key spends the
// tokens of its lease (booked in Redis before it failed), then its
// fallback; it asks for no lease while Redis is away.
func TestOutageSpendsTheLeaseInHand(t *testing.T) {
	f := newFailoverTest(t, PerSecond(1e4).WithBurst(1000), 1)
	ctx := context.Background()
	calls := 0
	f.store.leases = func(n int64, span time.Duration) store.TokenLease {
		calls++
		return store.TokenLease{Tokens: 10, End: time.Hour, Now: f.clock.Now().UnixMicro()}
	}
	for range demandHot + 1 {
		if err := f.r.Wait(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	f.r.tokens.refills.Wait()
	v, _ := f.r.tokens.keys.Load("k")
	left := int(v.(*keyLeases).cur.Load().left.Load()) // of its 10, the last waits took some
	f.fail()
	for i := range left + 2 {
		g, err := f.r.waitGrant(ctx, "k", 1)
		want := i < left // the lease's tokens, then the fallback
		if err != nil || g.leased != want || !want && g.limiter != localLimiter {
			t.Errorf("wait %d in the outage: leased %v, by %q (%v); want leased %v, else by the fallback", i, g.leased, g.limiter, err, want)
		}
	}
	if calls != 1 {
		t.Errorf("%d lease calls; want the one before the outage", calls)
	}
}
