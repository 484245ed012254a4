package pace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// slotters returns a Local and a Redis limiter (on a real redis-server) of
// quota q, by name.
func slotters(t *testing.T, q Quota, opts ...Option) map[string]backend {
	t.Helper()
	loc, err := NewLocal(q, opts...)
	if err != nil {
		t.Fatal(err)
	}
	redisOpts := []Option{WithFleetSize(1)}
	for _, o := range opts {
		redisOpts = append(redisOpts, o)
	}
	r := mustRedis(t, newTestRedis(t), q, redisOpts...)
	t.Cleanup(func() {
		if since, cause := r.failover.Last(); !since.IsZero() {
			t.Errorf("the Redis limiter fell back at %v: %v", since, cause)
		}
	})
	return map[string]backend{"local": loc, "redis": r}
}

// TestSlotsCapInFlight: 20 goroutines through a cap of 3 never hold more
// than 3 slots at once, and all get through.
func TestSlotsCapInFlight(t *testing.T) {
	for name, l := range slotters(t, Concurrent(3)) {
		t.Run(name, func(t *testing.T) {
			var held, most, done atomic.Int32
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					slot, err := l.Acquire(context.Background(), "k", 1)
					if err != nil {
						t.Error(err)
						return
					}
					n := held.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(10 * time.Millisecond)
					held.Add(-1)
					if err := slot.Release(); err != nil {
						t.Error(err)
					}
					done.Add(1)
				})
			}
			wg.Wait()
			if most.Load() != 3 || done.Load() != 20 {
				t.Errorf("at most %d held at once, %d of 20 through; want 3 and all", most.Load(), done.Load())
			}
		})
	}
}

// TestSlotsFirstComeFirstServed: waiters get their slots in the order they
// joined the line; one whose context ends leaves it, and the next moves up.
func TestSlotsFirstComeFirstServed(t *testing.T) {
	for name, l := range slotters(t, Concurrent(1)) {
		t.Run(name, func(t *testing.T) {
			first, err := l.Acquire(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			order := make(chan int, 5)
			leaving, leave := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for i := range 5 {
				ctx := context.Background()
				if i == 2 {
					ctx = leaving
				}
				wg.Go(func() {
					slot, err := l.Acquire(ctx, "k", 1)
					if i == 2 {
						if !errors.Is(err, context.Canceled) {
							t.Errorf("the waiter that left: %v, want context.Canceled", err)
						}
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					order <- i
					slot.Release()
				})
				waitInLine(t, l, "k", i+1) // in line in turn
			}
			leave()
			waitInLine(t, l, "k", 4)
			first.Release()
			wg.Wait()
			close(order)
			var got []int
			for i := range order {
				got = append(got, i)
			}
			if fmt.Sprint(got) != "[0 1 3 4]" {
				t.Errorf("served in order %v, want [0 1 3 4]", got)
			}
		})
	}
}

// TestSlotsWithRates: a cap beside a rate limit holds both: Wait on a
// capped quota takes a slot for its wait and frees it (in line while all
// are held); Reserve refuses it with an error that names the cap; Acquire
// paces at the rate too.
func TestSlotsWithRates(t *testing.T) {
	for name, l := range slotters(t, AllOf(Concurrent(4), PerSecond(20).WithBurst(1))) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			checkWaitTakesASlot(t, l)
			if _, err := l.(backend).Reserve(ctx, "k", nil); err == nil || !errorHas(err, "4 in flight") {
				t.Errorf("Reserve on a capped quota: %v, want an error naming the cap", err)
			}
			start := time.Now()
			for range 5 {
				slot, err := l.Acquire(ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				slot.Release()
			}
			if took := time.Since(start); took < 190*time.Millisecond {
				t.Errorf("5 acquisitions at 20/s burst 1 took %v, want at least 200 ms", took)
			}
			if _, err := l.Acquire(ctx, "k", 2); err == nil || !errorHas(err, "cost 2", "burst 1") {
				t.Errorf("a cost above the burst: %v, want an error naming both", err)
			}
		})
	}
}

// TestSlotsLapse: a slot whose holder stops renewing it (a process that
// died) goes to the next in line once its lease ends, and the observer
// hears it lapsed.
func TestSlotsLapse(t *testing.T) {
	const lease = 300 * time.Millisecond
	var expired atomic.Int32
	observe := WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventSlotExpire {
			expired.Add(int32(e.Cost))
		}
	})
	for name, l := range slotters(t, Concurrent(1), WithLease(lease), observe) {
		t.Run(name, func(t *testing.T) {
			expired.Store(0)
			dead, err := l.Acquire(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			dead.stop() // no more renewals, and no release
			start := time.Now()
			next, err := l.Acquire(context.Background(), "k", 1)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Release()
			t.Logf("the next in line got the slot after %v", took)
			if took < lease-50*time.Millisecond || took > lease+100*time.Millisecond || expired.Load() != 1 {
				t.Errorf("the next in line waited %v for a lease of %v, and %d lapsed; want about the lease, and 1", took, lease, expired.Load())
			}
		})
	}
}

// TestSlotsRenewed: a slot held for several leases is renewed and stays
// held: nobody else gets it until it is released.
func TestSlotsRenewed(t *testing.T) {
	besideOthers(t)
	const lease = 150 * time.Millisecond
	for name, l := range slotters(t, Concurrent(1), WithLease(lease)) {
		t.Run(name, func(t *testing.T) {
			held, err := l.Acquire(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*lease)
			defer cancel()
			if slot, err := l.Acquire(ctx, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
				slot.Release()
				t.Errorf("while the slot was held and renewed for 4 leases, another got %v, want a deadline error", err)
			}
			held.Release()
			if slot, err := l.Acquire(context.Background(), "k", 1); err != nil {
				t.Error(err)
			} else {
				slot.Release()
			}
		})
	}
}

// TestSlotsBadInput: bad caps are errors that name the value.
func TestSlotsBadInput(t *testing.T) {
	for _, tc := range []struct {
		q    Quota
		want string
	}{
		{Concurrent(0), "count 0"},
		{Concurrent(-2), "count -2"},
		{Concurrent(maxSlots + 1), "1048577 in flight"},
		{AllOf(Concurrent(2), Concurrent(3)), "2 caps in flight"},
		{Concurrent(2).Learn(), "cannot learn"},
		{Concurrent(2).Named("a#b"), `"a#b"`},
	} {
		if _, err := NewLocal(tc.q); err == nil || !errorHas(err, tc.want) {
			t.Errorf("NewLocal(%v): %v, want an error with %q", tc.q, err, tc.want)
		}
	}
	if _, err := NewLocal(Concurrent(2), WithLease(time.Millisecond)); err == nil || !errorHas(err, "WithLease(1ms)") {
		t.Errorf("WithLease(1ms): %v, want an error naming it", err)
	}
}

// checkWaitTakesASlot: Wait on l's quota, capped at 4 in flight, waits in
// line while the 4 slots are held (here past its 200 ms), and once one is
// free, is granted and frees it again.
func checkWaitTakesASlot(t *testing.T, l backend) {
	t.Helper()
	ctx := context.Background()
	var held []*Slot
	for range 4 {
		slot, err := l.TakeSlot(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, slot)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := l.Wait(short, "k", 1); err == nil {
		t.Errorf("Wait with the 4 slots held: granted, want it in line past its deadline")
	}
	held[0].Release()
	if err := l.Wait(ctx, "k", 1); err != nil {
		t.Errorf("Wait with a slot free: %v", err)
	}
	again, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	slot, err := l.TakeSlot(again, "k")
	if err != nil {
		t.Errorf("a slot after Wait: %v, want the one Wait took freed", err)
	}
	slot.Release()
	for _, s := range held[1:] {
		s.Release()
	}
}

// waitInLine waits until n requests are in key's line at l.
func waitInLine(t *testing.T, l backend, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if inLine(t, l, key) == n {
			return
		}
	}
	t.Fatalf("%d in line, want %d", inLine(t, l, key), n)
}

// inLine counts the requests in key's line at l.
func inLine(t *testing.T, l backend, key string) int {
	switch l := l.(type) {
	case *Local:
		l.slots.mu.Lock()
		defer l.slots.mu.Unlock()
		if line := l.slots.keys[key]; line != nil {
			return len(line.line)
		}
		return 0
	case *Redis:
		n, err := l.client.(*redis.Client).ZCard(context.Background(), DefaultPrefix+"{"+key+"}"+store.LineSuffix+limitName(l.cap.limit)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	t.Fatalf("a %T", l)
	return 0
}

// errorHas reports whether err's message contains every one of parts.
func errorHas(err error, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			return false
		}
	}
	return true
}

// TestSlotsTakenWithTheBooking: on a real Redis, a capped request with a
// slot free and nobody in line takes its slot with its booking, in one
// script call, and frees it in one more (before, three: a slot, a booking,
// a release); one that finds the cap full goes in line and gets the slot
// the release hands on; a call asked again finds its own slot. Foreign
// data at the cap's keys is a *KeyError naming the key, which stays as it
// was.
func TestSlotsTakenWithTheBooking(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	r := mustRedis(t, c, AllOf(PerSecond(1000), Concurrent(1)), WithFleetSize(1))
	calls := func() int64 {
		stats, err := redistest.CommandStats(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return redistest.ScriptCalls(stats)
	}
	r.Wait(ctx, "warm", 1) // the scripts loaded, the heartbeat sent
	before := calls()
	slot, err := r.Acquire(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	took := calls() - before
	if took != 1 {
		t.Errorf("a free slot took %d script calls with its booking, want 1", took)
	}
	// The cap full, the next request goes in line; the release, which
	// finds it there, hands the slot on.
	next := make(chan error, 1)
	go func() {
		s, err := r.Acquire(ctx, "k", 1)
		if err == nil {
			err = s.Release()
		}
		next <- err
	}()
	line := "pace:{k}" + store.LineSuffix + limitName(Concurrent(1))
	for deadline := time.Now().Add(10 * time.Second); c.ZCard(ctx, line).Val() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second request never joined the line")
		}
	}
	if err := slot.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-next:
		if err != nil {
			t.Errorf("the request in line: %v", err)
		}
	case <-time.After(time.Second): // a lease, when the hand-over is lost
		t.Errorf("the request in line was not handed the slot within a second of its release")
	}
	before = calls()
	if slot, err = r.Acquire(ctx, "k", 1); err == nil {
		err = slot.Release()
	}
	if n := calls() - before; err != nil || n != 2 {
		t.Errorf("a slot taken and freed with nobody in line: %d script calls (%v), want 2", n, err)
	}

	// A call asked again (its answer lost) finds the slot its first call
	// took: it is not turned away by a cap its own slot fills.
	st, holders := storeOf(r), "pace:{again}"+store.SlotsSuffix+limitName(Concurrent(1))
	q := store.Request{Key: "again", Costs: uniform(1, store.MaxLimits), Call: st.NewCall(), Take: store.SlotTake{ID: "again:1", Cap: r.slotCap}}
	for i := range 2 {
		if b, err := st.Reserve(ctx, q, MaxDelay, 0); err != nil || b.SlotBusy || !b.Granted {
			t.Errorf("call %d of one booking with its slot: %+v, %v; want it granted, with the slot", i+1, b, err)
		}
	}
	if n := c.ZCard(ctx, holders).Val(); n != 1 {
		t.Errorf("%d holders after a call asked twice, want 1", n)
	}
	// Booked again and refused (its key retimed while it slept, and its
	// deadline near), the request keeps no slot.
	q.Call = st.NewCall()
	if b, err := st.Reserve(ctx, q, -time.Microsecond, 0); err != nil || b.Granted || b.SlotBusy {
		t.Errorf("a booking of the request refused: %+v, %v; want it refused, not busy", b, err)
	}
	if n := c.ZCard(ctx, holders).Val(); n != 0 {
		t.Errorf("%d holders after the request's booking was refused, want 0", n)
	}

	for i, suffix := range []string{store.SlotsSuffix, store.LineSuffix} {
		key := fmt.Sprintf("foreign%d", i)
		redisKey := "pace:{" + key + "}" + suffix + limitName(Concurrent(1))
		if err := c.Set(ctx, redisKey, "x", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := r.Acquire(ctx, key, 1)
		var keyErr *KeyError
		if !errors.As(err, &keyErr) || keyErr.RedisKey != redisKey || !strings.Contains(err.Error(), "holds a string") {
			t.Errorf("a string at %s: %v, want a *KeyError naming it", redisKey, err)
		}
		if v := c.Get(ctx, redisKey).Val(); v != "x" {
			t.Errorf("the foreign key %s holds %q after Acquire, want it as it was", redisKey, v)
		}
	}
}
