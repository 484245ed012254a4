package pace

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestBreakerCooldowns: the cool-down doubles with each failed probe, with
// jitter of ±20%, up to the cap; one probe goes at a time; a successful probe
// brings Redis back.
func TestBreakerCooldowns(t *testing.T) {
	b := breaker{minCooldown: 100 * time.Millisecond, maxCooldown: time.Second}
	now := time.Unix(1_700_000_000, 0)
	failure := errors.New("connection refused")
	if r, _, _ := b.route(now); r != viaRedis {
		t.Fatalf("a new breaker routes %v, want viaRedis", r)
	}
	began, _ := b.fail(now, false, failure, func() *Local { return nil })
	if !began {
		t.Fatal("the first failure did not begin an outage")
	}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		cooldown := b.retryAt.Sub(now)
		if cooldown < want*8/10 || cooldown > min(want*12/10, time.Second) {
			t.Fatalf("cool-down %d = %v, want %v ± 20%%, at most 1s", i, cooldown, want)
		}
		if r, cause, _ := b.route(now.Add(cooldown - time.Millisecond)); r != withoutRedis || cause != failure {
			t.Fatalf("during cool-down %d: route %v (cause %v), want withoutRedis for %v", i, r, cause, failure)
		}
		now = now.Add(cooldown)
		if r, _, _ := b.route(now); r != viaProbe {
			t.Fatalf("after cool-down %d: route %v, want viaProbe", i, r)
		}
		if r, _, _ := b.route(now); r != withoutRedis {
			t.Fatalf("during the probe: route %v, want withoutRedis (one probe at a time)", r)
		}
		if began, _ := b.fail(now, true, failure, nil); began {
			t.Fatal("a failed probe began a new outage")
		}
	}
	now = now.Add(b.retryAt.Sub(now))
	b.route(now) // the probe
	if outage, _ := b.recover(now); outage <= 0 {
		t.Errorf("recover reported an outage of %v", outage)
	}
	if r, _, _ := b.route(now); r != viaRedis {
		t.Errorf("after recovery: route %v, want viaRedis", r)
	}
}

// TestFleetCountsProcesses: limiters that share a fleet name count one
// another by heartbeats, forget those that stop, and pace at their share
// when Redis fails.
func TestFleetCountsProcesses(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	var members []*Redis // three processes, as far as the fleet can tell
	for range 3 {
		members = append(members, mustRedis(t, c, PerSecond(300).WithBurst(30)))
	}
	other := mustRedis(t, c, PerSecond(300), WithFleetName("other"))
	beat := func(r *Redis, skew time.Duration) {
		t.Helper()
		b, err := r.reserve(ctx, "k", 1, noBudget)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.fleet.beat(ctx, r.calls, c.Pipeline(), b.now+skew.Microseconds()); err != nil {
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
	fallback := members[0].newFallback()
	if got, want := fallback.limit, PerSecond(100).WithBurst(10); got != want {
		t.Errorf("fallback limit %v, want a third of the limit, %v", got, want)
	}

	beat(members[0], heartbeatTTL+time.Second) // the others' heartbeats are now too old
	if n := members[0].fleet.Size(); n != 1 {
		t.Errorf("after the others stopped beating, the fleet counts %d, want 1", n)
	}
	if n := mustRedis(t, c, PerSecond(300), WithFleetSize(5)).fleet.Size(); n != 5 {
		t.Errorf("WithFleetSize(5): size %d", n)
	}
}

// TestFallbackStartsEmpty: the local pacing of an outage starts with empty
// buckets, lest every process burst its share on top of what Redis granted
// just before; it fills at the share's rate.
func TestFallbackStartsEmpty(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	loc := newLocal(PerSecond(10).WithBurst(5), commonConfig{maxWait: time.Millisecond})
	loc.now = clock.Now
	loc.emptyAt = clock.Now()
	var de *DeadlineError
	if err := loc.Wait(ctx, "k", 1); !errors.As(err, &de) || de.Delay != 100*time.Millisecond {
		t.Fatalf("the first wait of an outage: %v, want a refusal of a 100ms wait", err)
	}
	clock.Advance(time.Second) // full again
	for i := range 5 {
		if err := loc.Wait(ctx, "k", 1); err != nil {
			t.Fatalf("grant %d of a full bucket: %v", i, err)
		}
	}
	if err := loc.Wait(ctx, "k", 1); !errors.As(err, &de) {
		t.Fatalf("the 6th wait: %v, want a refusal: the burst is 5", err)
	}
}

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
		t.Errorf("the first local grant came %v after the first booking, before the last booked slot (300 ms) and its interval", took)
	}
}
