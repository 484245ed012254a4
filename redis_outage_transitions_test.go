package pace

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// Transitions against a real redis-server, killed or restarted by the test,
// with the default options: what an outage does to keys that did not cause
// it, and what a restart does to the fleet's holds.

// TestFallbackAfterBookedSlots: callers booked in Redis before an outage
// keep their slots, and the outage's local pacing begins only after the
// last of them, so the two together do not go over the limit.
func TestFallbackAfterBookedSlots(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	booked := make(chan struct{}, 8)
	r := mustRedis(t, srv.Client(t), PerSecond(10).WithBurst(1), WithFleetSize(1), WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventWait && e.Limiter == "redis" {
			booked <- struct{}{}
		}
	}))
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 { // slots at 0, 100, 200 and 300 ms
		wg.Go(func() { r.Wait(ctx, "k", 1) })
		<-booked
	}
	srv.Kill()
	if err := r.Wait(ctx, "k", 1); err != nil { // Redis is gone: the fallback decides
		t.Fatal(err)
	}
	took := time.Since(start)
	wg.Wait()
	if took < 390*time.Millisecond {
		t.Errorf("the first local grant came %v after the first booking, before the last booked time (300 ms) and its interval", took)
	}
}

// bookWaits starts n waits for key on lim, each booked (its EventWait seen
// on booked) before the next, and returns a function that ends them all.
func bookWaits(t *testing.T, lim Limiter, booked <-chan Event, key string, n int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
	}
	for range n {
		wg.Go(func() { lim.Wait(ctx, key, 1) })
		select {
		case <-booked:
		case <-time.After(5 * time.Second):
			stop()
			t.Fatalf("a wait for %q was not booked within 5s", key)
		}
	}
	return stop
}

// waitsOn returns an observer that sends the EventWait of key on a channel.
func waitsOn(key string) (Observer, chan Event) {
	booked := make(chan Event, 1024)
	return func(_ context.Context, e Event) {
		if e.Kind == EventWait && e.Key == key {
			booked <- e
		}
	}, booked
}

// TestOutageKeepsKeysApart: one key booked far ahead, or held, when Redis
// dies does not delay any other key during the outage: each key's local
// pacing begins after its own last time (10/s, fleet of 1: 100 ms for a key
// never used), once two calls have timed out (the breaker's confirmation;
// their timeout set by the round trips of the bookings: 300 at once take
// longer than one).
func TestOutageKeepsKeysApart(t *testing.T) {
	for name, book := range map[string]func(*Redis, <-chan Event) func(){
		"300 callers queued on one key": func(r *Redis, booked <-chan Event) func() {
			return bookWaits(t, r, booked, "hot", 300)
		},
		"one key held for 5s, one caller booked after the hold": func(r *Redis, booked <-chan Event) func() {
			if err := r.Hold(context.Background(), "hot", headers.Hold{For: 5 * time.Second, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			return bookWaits(t, r, booked, "hot", 1)
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			observe, booked := waitsOn("hot")
			r := mustRedis(t, srv.Client(t), PerSecond(10), WithFleetSize(1), WithObserver(observe))
			stop := book(r, booked)
			defer stop()
			timeout := r.calls.Timeout() // as the bookings' round trips set it
			srv.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			err := r.Wait(ctx, "cold", 1)
			took := time.Since(start)
			t.Logf("a cold key during the outage: %v after %v (the call timeout %v)", err, took, timeout)
			if err != nil || took > 100*time.Millisecond+2*timeout*5/4+schedulingSlack {
				t.Errorf("a cold key during the outage: %v after %v; want a grant within 100ms plus two calls of a timeout of %v", err, took, timeout)
			}
		})
	}
}

// TestHoldAfterRestartReachesSleepers: a hold set by another process just
// after Redis restarted, before this process's subscription to the hold
// channel stands again, still stops the callers this process has asleep:
// they read the hold from Redis when they wake. (They wake from 250 ms after
// the restart on: go-redis redials a broken subscription inside Receive, up
// to 5 times 100 ms apart by default, and only then says it broke; a caller
// that wakes before that goes at its time, see docs/failures.md.)
func TestHoldAfterRestartReachesSleepers(t *testing.T) {
	besideOthers(t)
	ctx := context.Background()
	srv := redistest.Start(t)
	observe, booked := waitsOn("k")
	sleeper := mustRedis(t, srv.Client(t), PerSecond(4).WithBurst(1), WithFleetSize(1), WithObserver(observe))
	holder := mustRedis(t, srv.Client(t), PerSecond(4).WithBurst(1), WithFleetSize(1))
	if err := sleeper.Wait(ctx, "k", 1); err != nil { // the bucket is empty, the subscription stands
		t.Fatal(err)
	}
	<-booked
	done := make(chan time.Time, 3)
	for range 3 { // asleep until 250, 500 and 750 ms from now
		go func() {
			sleeper.Wait(ctx, "k", 1)
			done <- time.Now()
		}()
		<-booked
	}
	srv.Restart()
	held := time.Now()
	if err := holder.Hold(ctx, "k", headers.Hold{For: time.Second, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("hold set %v after the restart", time.Since(held))
	for range 3 {
		if at := <-done; at.Sub(held) < time.Second {
			t.Errorf("a caller asleep through the restart went %v after the hold, within its 1s", at.Sub(held))
		}
	}
}

// TestFleetCountsProcesses: processes that share a fleet name count one
// another by heartbeats, forget those that stop, and pace at their share
// when Redis fails; the limiters of one process are one member (before, three
// limiters of one process alone paced at a third of their limits).
func TestFleetCountsProcesses(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	var members []*Redis // three processes, as far as the fleet can tell
	for i := range 3 {
		r := mustRedis(t, c, PerSecond(300).WithBurst(30))
		r.fleet.member = "process-" + strconv.Itoa(i)
		members = append(members, r)
	}
	other := mustRedis(t, c, PerSecond(300), WithFleetName("other"))
	beat := func(r *Redis, skew time.Duration) {
		t.Helper()
		b, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.fleet.beat(ctx, r.calls, c.Pipeline(), b.Now+skew.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		for _, r := range members {
			beat(r, 0)
		}
	}
	beat(other, 0)
	for i, r := range members {
		if n := r.fleet.Size(); n != 3 {
			t.Errorf("member %d counts a fleet of %d, want 3", i, n)
		}
	}
	if n := other.fleet.Size(); n != 1 {
		t.Errorf("another fleet's member counts %d, want 1", n)
	}
	fallback := members[0].fallbackLimiter(time.Now(), nil)
	if got, want := fallback.limits[0], PerSecond(100).WithBurst(10); got != want {
		t.Errorf("fallback limit %v, want a third of the limit, %v", got, want)
	}

	beat(members[0], heartbeatTTL+time.Second) // the others' heartbeats are now too old
	if n := members[0].fleet.Size(); n != 1 {
		t.Errorf("after the others stopped beating, the fleet counts %d, want 1", n)
	}
	if n := mustRedis(t, c, PerSecond(300), WithFleetSize(5)).fleet.Size(); n != 5 {
		t.Errorf("WithFleetSize(5): size %d", n)
	}

	var limiters []*Redis // of this process, one for each of three hosts
	for range 3 {
		limiters = append(limiters, mustRedis(t, c, PerSecond(30), WithFleetName("crawler")))
	}
	for _, r := range limiters {
		beat(r, 0)
	}
	for i, r := range limiters {
		if n := r.fleet.Size(); n != 1 {
			t.Errorf("limiter %d of one process counts a fleet of %d, want 1", i, n)
		}
	}
	if got := limiters[2].fallbackLimiter(time.Now(), nil).limits[0]; got != PerSecond(30) {
		t.Errorf("a process alone falls back to %v, want its whole limit", got)
	}
}

// TestFleetStartedTogether: processes started together count one another
// within a few heartbeats of their first calls, so that an outage soon after
// the start finds each at its share (before, the second heartbeat came 100
// ms after the first, and a process paced at the whole limit until then).
func TestFleetStartedTogether(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	var members []*Redis
	for i := range 3 {
		r := mustRedis(t, c, PerSecond(3000).WithBurst(30), sharedOnly)
		r.fleet.member = "process-" + strconv.Itoa(i)
		members = append(members, r)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, r := range members {
		wg.Go(func() {
			for time.Since(start) < 60*time.Millisecond {
				if err := r.Wait(ctx, "k", 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, r := range members {
		if n := r.fleet.Size(); n != 3 {
			t.Errorf("member %d counts a fleet of %d 60 ms after the start, want 3", i, n)
		}
	}
}

// TestOutageSharesTheProcessShare: three limiters of one process pace one
// key at 100/s burst 5 (a fleet of one), 4 goroutines each, through clients
// of their own, while Redis fails: killed 1 s into a run of 5 s and
// restarted, empty, 2 s later; or, under a Sentinel, its master killed 2 s
// into a run of 10 s, the replica promoted. During the outage the three
// share the process's share, one fallback bucket, so the run grants at
// most b + r*t, and b more after (Redis's bucket full again), with no
// second above 2 x (b + r) (before, each limiter paced at the share: under
// the Sentinel failover, 1,523 grants in 10 s, 254-300 a second).
func TestOutageSharesTheProcessShare(t *testing.T) {
	besideOthers(t)
	t.Run("killed and restarted", func(t *testing.T) {
		srv := redistest.Start(t)
		checkOutageShare(t, 5*time.Second, func() *redis.Client { return redistest.ClientOf(t, srv.Addr) }, func() {
			time.Sleep(time.Second)
			srv.Kill()
			time.Sleep(2 * time.Second)
			srv.Restart()
		})
	})
	t.Run("a Sentinel failover", func(t *testing.T) {
		s := redistest.StartSentinel(t)
		checkOutageShare(t, 10*time.Second, func() *redis.Client { return s.Client(t) }, func() {
			time.Sleep(2 * time.Second)
			s.Master.Kill()
		})
	})
}

// checkOutageShare runs TestOutageSharesTheProcessShare for run on clients
// from client, calling fault at the start.
func checkOutageShare(t *testing.T, run time.Duration, client func() *redis.Client, fault func()) {
	const rate, burst = 100, 5
	var mu sync.Mutex
	var grants []time.Time
	var local int
	start := time.Now()
	var wg sync.WaitGroup
	for range 3 {
		r := mustRedis(t, client(), PerSecond(rate).WithBurst(burst), WithFleetSize(1))
		for range 4 {
			wg.Go(func() {
				for {
					ctx, cancel := context.WithDeadline(context.Background(), start.Add(run))
					g, err := r.waitGrant(ctx, "k", 1)
					cancel()
					if err != nil {
						return
					}
					mu.Lock()
					grants = append(grants, time.Now())
					if g.booking.limiter == "local" {
						local++
					}
					mu.Unlock()
				}
			})
		}
	}
	fault()
	wg.Wait()
	busiest := busiestSecond(grants)
	bound := burst + rate*run.Seconds() + burst
	t.Logf("%d grants in %v, %d local (b + r*t + b = %.0f); the busiest second %d", len(grants), run, local, bound, busiest)
	if local == 0 {
		t.Fatal("no grant was local: the outage was not met")
	}
	if float64(len(grants)) > bound || busiest > 2*(burst+rate) {
		t.Errorf("%d grants, the busiest second %d; want at most %.0f, and %d", len(grants), busiest, bound, 2*(burst+rate))
	}
}
