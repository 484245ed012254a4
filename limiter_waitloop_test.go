package pace

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/outage"
)

// The wait loop's table tests: Redis.Wait itself, sleeps and all, over the
// fake store, in a synctest bubble, whose clock and timers are fake (time
// moves only when every goroutine of the bubble is blocked), so each row
// takes well under 100 ms and its times are exact.

// newBubbleTest returns a Redis limiter of l over a fake store on the
// clock of the bubble the test runs in, with the default options but a
// pinned fleet size.
func newBubbleTest(t *testing.T, l Limit, fleetSize int) *failoverTest {
	return newFailoverTestOn(t, l, fleetSize, nil, time.Now)
}

// waiting is a Wait under way in the bubble.
type waiting struct {
	done  chan struct{}
	err   error
	took  time.Duration
	start time.Time
}

// start begins a Wait of cost 1 for key on f's limiter, and lets it run
// until it blocks (asleep, or done).
func (f *failoverTest) start(ctx context.Context, key string) *waiting {
	w := &waiting{done: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(w.done)
		w.err = f.r.Wait(ctx, key, 1)
		w.took = time.Since(w.start)
	}()
	synctest.Wait()
	return w
}

// end waits for w's end and returns its error and how long it took.
func (w *waiting) end() (error, time.Duration) {
	<-w.done
	return w.err, w.took
}

func TestWaitLoop(t *testing.T) {
	tenPerSecond := PerSecond(10).WithBurst(1)
	ctx := context.Background()
	for _, row := range []struct {
		name  string
		limit Limit
		fleet int
		run   func(t *testing.T, f *failoverTest)
	}{
		{"a caller asleep when a hold comes books again after the hold", tenPerSecond, 1, func(t *testing.T, f *failoverTest) {
			f.start(ctx, "k").end() // the burst
			w := f.start(ctx, "k")  // asleep for 100 ms
			time.Sleep(50 * time.Millisecond)
			if err := f.r.Hold(ctx, "k", headers.Hold{For: time.Second, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			err, took := w.end()
			if err != nil || took < 1050*time.Millisecond || took > 1150*time.Millisecond || f.store.reserves != 3 {
				t.Errorf("%v after %v, %d reserves; want a grant 1.05 s to 1.15 s in (the hold's end), booked again", err, took, f.store.reserves)
			}
		}},
		{"a retime while asleep: the caller gives its booking back and books anew", tenPerSecond, 1, func(t *testing.T, f *failoverTest) {
			f.start(ctx, "k").end()
			w := f.start(ctx, "k")
			time.Sleep(50 * time.Millisecond)
			f.r.retimes.Add("k", time.Now().UnixMicro(), 0, true, time.Now())
			err, took := w.end()
			if err != nil || took != 100*time.Millisecond || f.store.refunds != 1 || f.store.reserves != 3 {
				t.Errorf("%v after %v, %d refunds, %d reserves; want the same time, 100 ms in, booked again after one refund", err, took, f.store.refunds, f.store.reserves)
			}
		}},
		{"a caller cancelled while asleep gives its tokens to the next", tenPerSecond, 1, func(t *testing.T, f *failoverTest) {
			f.start(ctx, "k").end()
			cctx, cancel := context.WithCancel(ctx)
			w := f.start(cctx, "k")
			time.Sleep(50 * time.Millisecond)
			cancel()
			if err, took := w.end(); !errors.Is(err, context.Canceled) || took != 50*time.Millisecond || f.store.refunds != 1 {
				t.Fatalf("cancelled: %v after %v, %d refunds; want context.Canceled at once, one refund", err, took, f.store.refunds)
			}
			if err, took := f.start(ctx, "k").end(); err != nil || took != 50*time.Millisecond {
				t.Errorf("the next caller: %v after %v; want the time given back, 50 ms in", err, took)
			}
		}},
		{"an outage while a caller sleeps keeps its booking", tenPerSecond, 1, func(t *testing.T, f *failoverTest) {
			f.start(ctx, "k").end()
			w := f.start(ctx, "k")
			f.store.mu.Lock()
			f.store.down = errConnRefused
			f.store.mu.Unlock()
			if err, took := w.end(); err != nil || took != 100*time.Millisecond {
				t.Errorf("%v after %v; want its time, 100 ms in", err, took)
			}
		}},
		{"a call that timed out after Redis booked it: asked again, its tokens spent, never granted twice", tenPerSecond, 1, func(t *testing.T, f *failoverTest) {
			f.store.bookThenFail, f.store.failTakes = 1, DefaultCallTimeout
			err, took := f.start(ctx, "k").end()
			if err != nil || took != 100*time.Millisecond || f.store.reserves != 2 || f.r.failover.Mode() != outage.Shared {
				t.Fatalf("%v after %v, %d reserves, mode %v; want the second booking's time, 100 ms in, on Redis", err, took, f.store.reserves, f.r.failover.Mode())
			}
			if err, took := f.start(ctx, "k").end(); err != nil || took != 100*time.Millisecond {
				t.Errorf("the next caller: %v after %v; want the time after both bookings, 100 ms in", err, took)
			}
		}},
		{"a booking ahead whose answer was lost: asked again with its id, it is found, not booked twice", tenPerSecond, 1, func(t *testing.T, f *failoverTest) {
			f.start(ctx, "k").end() // the burst
			f.store.bookThenFail, f.store.failTakes = 1, DefaultCallTimeout
			err, took := f.start(ctx, "k").end()
			if err != nil || took != 100*time.Millisecond || f.store.reserves != 3 {
				t.Fatalf("%v after %v, %d reserves; want the first booking's time, 100 ms in, in 3 calls", err, took, f.store.reserves)
			}
			if err, took := f.start(ctx, "k").end(); err != nil || took != 100*time.Millisecond {
				t.Errorf("the next caller: %v after %v; want its own interval, 100 ms", err, took)
			}
		}},
		{"returning: the outage's share paces each request first, then Redis books it for then", PerSecond(100).WithBurst(10), 2, func(t *testing.T, f *failoverTest) {
			f.store.down = errConnRefused
			f.start(ctx, "trigger").end()
			f.store.down = nil
			time.Sleep(DefaultMaxCooldown) // the share's bucket of 5 is full again; the next request probes
			start := time.Now()
			for range 10 {
				if err, _ := f.start(ctx, "k").end(); err != nil {
					t.Fatal(err)
				}
			}
			// The share, 50/s burst 5: 5 at once, then one each 20 ms. Redis
			// alone would have granted all 10 at once.
			if took := time.Since(start); took != 100*time.Millisecond || f.r.failover.Mode() != outage.Returning {
				t.Errorf("10 requests while returning took %v, mode %v; want 100 ms, returning", took, f.r.failover.Mode())
			}
			time.Sleep(outage.ReturnWindow(f.r.config.maxCooldown, f.r.config.callTimeout))
			start = time.Now()
			for range 10 {
				f.start(ctx, "k2").end()
			}
			if took := time.Since(start); took != 0 || f.r.failover.Mode() != outage.Shared {
				t.Errorf("after the settle time, 10 requests took %v, mode %v; want Redis's burst at once, shared", took, f.r.failover.Mode())
			}
		}},
	} {
		t.Run(row.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { row.run(t, newBubbleTest(t, row.limit, row.fleet)) })
		})
	}
}
