package pace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// localWindowDelay is the wait loc would give one more request on key now:
// 0 when it grants it (and books it), else what it would wait (booking
// nothing).
func localWindowDelay(loc *Local, key string) time.Duration {
	costs, now := uniform(1, store.MaxLimits), loc.now()
	delay, _ := loc.reserve(key, &costs, now, now, 0, &bucketsBooked{}, nil)
	return delay
}

// TestLocalFixedWindows: on a Local with a fake clock, a fixed window
// (epoch-aligned, a day or a month of a zone), alone and beside a bucket,
// grants its count in each window at once and makes the next request wait
// exactly to the window's end, across a 23 and a 25 hour day, a month of
// 28 days and a zone whose midnight is skipped.
func TestLocalFixedWindows(t *testing.T) {
	la, santiago := mustZone(t, "America/Los_Angeles"), mustZone(t, "America/Santiago")
	for _, c := range []struct {
		limit Limit
		from  time.Time
	}{
		{FixedWindow(3, time.Minute), time.Date(2026, 3, 7, 22, 0, 30, 0, time.UTC)},
		{Daily(3, la), time.Date(2026, 3, 7, 22, 0, 0, 0, la)},  // then 8 Mar: 23 h
		{Daily(3, la), time.Date(2026, 10, 31, 9, 0, 0, 0, la)}, // then 1 Nov: 25 h
		{Daily(3, santiago), time.Date(2026, 9, 5, 12, 0, 0, 0, santiago)},
		{Monthly(3, la), time.Date(2026, 1, 31, 23, 0, 0, 0, la)}, // then February
	} {
		for _, q := range []Quota{c.limit, AllOf(PerSecond(100), c.limit.Named("window"))} {
			t.Run(strings.ReplaceAll(fmt.Sprint(q), "/", " per "), func(t *testing.T) {
				clock := &fakeClock{now: c.from}
				loc := mustLocal(t, q)
				loc.now = clock.Now
				for window := range 3 {
					now := clock.Now()
					_, end := c.limit.Window(now)
					for i := range 3 {
						if d := localWindowDelay(loc, "k"); d != 0 {
							t.Fatalf("window %d from %v: request %d waits %v, want a grant", window, now, i, d)
						}
					}
					if d := localWindowDelay(loc, "k"); d != end.Sub(now) {
						t.Fatalf("window %d from %v: the fourth request waits %v, want to the window's end %v, %v away", window, now, d, end, end.Sub(now))
					}
					clock.Advance(end.Sub(now))
				}
			})
		}
	}
}

// TestLocalWindowGivesBack: on a Local, a request booked into tomorrow and
// cancelled leaves tomorrow's count as it was, and a reservation settled
// below its estimate gives today's window the difference.
func TestLocalWindowGivesBack(t *testing.T) {
	ctx := context.Background()
	la := mustZone(t, "America/Los_Angeles")
	clock := &fakeClock{now: time.Date(2026, 6, 1, 20, 0, 0, 0, la)}
	events := make(chan Event, 8)
	loc := mustLocal(t, AllOf(PerSecond(100), Daily(3, la).Named("day")), WithObserver(func(_ context.Context, e Event) { events <- e }))
	loc.now = clock.Now
	res, err := loc.Reserve(ctx, "k", Costs{"day": 3})
	if err != nil {
		t.Fatal(err)
	}
	<-events
	if err := loc.Settle(ctx, res, Costs{"day": 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if d := localWindowDelay(loc, "k"); d != 0 {
			t.Fatalf("after a settlement of 1 for an estimate of 3, request %d waits %v, want a grant: the 2 were not given back", i, d)
		}
	}
	drain(events)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- loc.Wait(wctx, "k", 3) }()
	for e := range events {
		if e.Kind == EventWait {
			if e.Delay != 4*time.Hour {
				t.Fatalf("a spent day's request books a wait of %v, want the 4h to midnight", e.Delay)
			}
			break
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled wait: %v, want context.Canceled", err)
	}
	clock.Advance(4 * time.Hour)
	for i := range 3 {
		if d := localWindowDelay(loc, "k"); d != 0 {
			t.Fatalf("at midnight, request %d waits %v, want a grant: the cancelled booking kept tomorrow's count", i, d)
		}
	}
}

// drain empties events of what is in it now.
func drain(events chan Event) {
	for {
		select {
		case <-events:
		default:
			return
		}
	}
}

// TestLocalRefusesSlidingWindows: a Local says it cannot keep a sliding
// window, by name.
func TestLocalRefusesSlidingWindows(t *testing.T) {
	_, err := NewLocal(AllOf(PerSecond(10), Window(100, time.Minute)))
	if err == nil || !strings.Contains(err.Error(), "100/m sliding") || !strings.Contains(err.Error(), "sliding windows need a Redis limiter") {
		t.Fatalf("NewLocal with a sliding window: %v, want an error that names it", err)
	}
}
