package pace

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDryRun, on Local and Redis at 20/s burst 2: 12 requests that
// arrive at once go at once, and the waits the dry run reports keep the
// schedule an enforcing limiter of the same limit keeps for them (beyond
// the burst, one due every 50 ms: within 5 ms each); a wait beyond the caller's deadline is
// reported refused, and goes too; an upstream's 429 with Retry-After
// holds nothing; a cap in flight is not kept; a quota of a cap alone is
// refused.
func TestDryRun(t *testing.T) {
	limit := mustParseLimit(t, "20/s burst 2")
	c := scriptRedis(t)
	for name, newLimiter := range map[string]func(...Option) Limiter{
		"local": func(o ...Option) Limiter { return mustLocal(t, limit, o...) },
		"redis": func(o ...Option) Limiter {
			opts := []Option{WithFleetSize(1), sharedOnly, WithPrefix("dry-" + time.Now().Format("150405.000000") + ":")}
			for _, x := range o {
				opts = append(opts, x)
			}
			return mustRedis(t, c, limit, opts...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			var log dueLog
			dry := newLimiter(WithDryRun(), WithObserver(log.observe))
			start := time.Now()
			var calls [][2]time.Time // when each Wait began and returned
			for range 12 {
				began := time.Now()
				if err := dry.Wait(context.Background(), "api", 1); err != nil {
					t.Fatal(err)
				}
				calls = append(calls, [2]time.Time{began, time.Now()})
			}
			took := time.Since(start)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if err := dry.Wait(ctx, "api", 1); err != nil {
				t.Errorf("a dry run's wait past its deadline: %v, want nil (reported, not refused)", err)
			}
			delays := log.waits()
			t.Logf("dry run: 12 requests in %v, delays %v; refused: %v", took, delays, log.refused)
			if took > 300*time.Millisecond || len(delays) != 12 {
				t.Fatalf("dry run: 12 requests took %v, %d waits reported; want at once, and 12", took, len(delays))
			}
			// Beyond the burst, which goes as it arrives, the schedule an
			// enforcing limiter keeps: one every 50 ms from the third on,
			// within 5 ms and the time the two calls took (each decided
			// at some time within its call).
			for i := 3; i < len(delays); i++ {
				want := time.Duration(i-2) * 50 * time.Millisecond
				earliest := calls[i][0].Add(delays[i]).Sub(calls[2][1].Add(delays[2]))
				latest := calls[i][1].Add(delays[i]).Sub(calls[2][0].Add(delays[2]))
				if earliest > want+5*time.Millisecond || latest < want-5*time.Millisecond {
					t.Errorf("request %d due %v to %v after the third, want %v within 5 ms", i, earliest, latest, want)
				}
			}
			if len(log.refused) != 1 || log.refused[0] < 400*time.Millisecond {
				t.Errorf("a dry run's wait past its deadline: refusals %v reported, want one, of a wait of about 550 ms", log.refused)
			}
		})
	}
}

// dueLog notes, of the events of one limiter, the delay of each
// EventWait, in order, and the delays of the dry run's refusals.
type dueLog struct {
	mu      sync.Mutex
	delays  []time.Duration
	refused []time.Duration
}

func (l *dueLog) observe(_ context.Context, e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case e.Kind == EventWait:
		l.delays = append(l.delays, e.Delay)
	case e.Kind == EventRefuse && e.DryRun:
		l.refused = append(l.refused, e.Delay)
	}
}

// waits returns the delays of the waits reported, in order.
func (l *dueLog) waits() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.delays)
}

// TestDryRunHeedsNothing: a Transport on a dry run sends a request at
// once after the upstream answered 429 with Retry-After: 5; on Local and
// Redis.
func TestDryRunHeedsNothing(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer upstream.Close()
	for name, l := range map[string]Limiter{
		"local": mustLocal(t, mustParseLimit(t, "100/s"), WithDryRun()),
		"redis": mustRedis(t, scriptRedis(t), mustParseLimit(t, "100/s"), WithFleetSize(1), sharedOnly, WithDryRun()),
	} {
		client := &http.Client{Transport: &Transport{Limiter: l}}
		start := time.Now()
		for range 3 {
			resp, err := client.Get(upstream.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: three requests after a Retry-After: 5 took %v, want at once: a dry run holds nothing", name, took)
		}
	}
}

// TestDryRunKeepsNoCap: on a dry run, 5 requests are in flight at once
// under a cap of 1; a dry run of a cap alone is refused, naming it.
func TestDryRunKeepsNoCap(t *testing.T) {
	l := mustLocal(t, AllOf(mustParseLimit(t, "1000/s"), Concurrent(1)), WithDryRun())
	var slots []*Slot
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		slot, err := l.Acquire(ctx, "api", 1)
		cancel()
		if err != nil {
			t.Fatalf("dry run, request %d under a cap of 1: %v", len(slots)+1, err)
		}
		slots = append(slots, slot)
	}
	for _, s := range slots {
		s.Release()
	}
	if _, err := NewLocal(Concurrent(4), WithDryRun()); err == nil || !containsAll(err.Error(), "WithDryRun", "4 in flight") {
		t.Errorf("a dry run of a cap alone: %v, want an error that names it", err)
	}
}

// containsAll reports whether s contains each of parts.
func containsAll(s string, parts ...string) bool {
	return !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(s, p) })
}

// TestDryRunBooksItsOwnSchedule: a dry run at 4/s books 200 requests
// (its schedule 50 s ahead) on a key, prefix and Redis it shares with
// enforcing limiters: an enforcing one at 40/s burst 40 beside it (a
// replica the rollout left enforcing) goes its whole burst at once; the
// dry run turned off (a limiter like it, enforcing) lets its first
// request go at once, where the dry run's schedule would hold it for
// 50 s. A dry run's bookings are its own; the fleet's dry runs share them
// (a second one waits behind the first's 200).
func TestDryRunBooksItsOwnSchedule(t *testing.T) {
	c := scriptRedis(t)
	prefix := WithPrefix("dry-own-" + time.Now().Format("150405.000000") + ":")
	slow := mustParseLimit(t, "4/s burst 1")
	dry := mustRedis(t, c, slow, WithFleetSize(1), sharedOnly, prefix, WithDryRun())
	for range 200 {
		if err := dry.Wait(context.Background(), "api", 1); err != nil {
			t.Fatal(err)
		}
	}
	now := WithWaitBudget(context.Background(), 0)
	enforcing := mustRedis(t, c, mustParseLimit(t, "40/s burst 40"), WithFleetSize(1), sharedOnly, prefix)
	for i := range 40 {
		if err := enforcing.Wait(now, "api", 1); err != nil {
			t.Fatalf("enforcing at 40/s burst 40, request %d beside a dry run: %v; want its burst at once", i+1, err)
		}
	}
	if err := mustRedis(t, c, slow, WithFleetSize(1), sharedOnly, prefix).Wait(now, "other", 1); err != nil {
		t.Fatalf("a first request on a fresh key: %v", err)
	}
	var log dueLog
	second := mustRedis(t, c, slow, WithFleetSize(1), sharedOnly, prefix, WithDryRun(), WithObserver(log.observe))
	if err := second.Wait(context.Background(), "api", 1); err != nil {
		t.Fatal(err)
	}
	if d := log.waits(); len(d) != 1 || d[0] < 40*time.Second {
		t.Errorf("a second dry run of the fleet after 200 booked at 4/s: waits %v, want one of 40 s or more (the dry runs share their schedule)", d)
	}
	if err := mustRedis(t, c, slow, WithFleetSize(1), sharedOnly, prefix).Wait(now, "api", 1); err == nil {
		t.Errorf("4/s enforcing on the key the 40 at 40/s just spent: went at once; want it refused (the enforcing schedule is theirs, not the dry run's)")
	}
}
