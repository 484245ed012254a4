package pace

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestFleetKeepsTheStricterLimit: two limiters on one Redis (two
// processes of a rolling deploy) pace one key, one at 100/s burst 5 from
// the start, the other at 200/s burst 10 from 0.5 s, 8 goroutines each.
// Both are told of the other's limit within a second (EventMismatch,
// naming both); the fleet goes at 100/s from then on, at most b + r t of
// the stricter, and at 95% of it at least; once the stricter stops (at
// 3 s), the other goes at its own 200/s again within 2 s.
func TestFleetKeepsTheStricterLimit(t *testing.T) {
	besideOthers(t)
	srv := newTestRedis(t)
	addr := srv.Options().Addr
	var mu sync.Mutex
	var grants []time.Time
	told := map[string]time.Time{} // by limit, when first told
	limiter := func(text string) *Redis {
		return mustRedis(t, redistest.ClientOf(t, addr), mustParseLimit(t, text), WithFleetSize(1), sharedOnly, WithObserver(func(_ context.Context, e Event) {
			if e.Kind != EventMismatch {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if _, ok := told[text]; !ok {
				told[text] = time.Now()
				t.Logf("%s told: %s", text, e.Reason)
				if !strings.Contains(e.Reason, "100/s burst 5") || !strings.Contains(e.Reason, "200/s burst 10") {
					t.Errorf("EventMismatch %q, want both limits named", e.Reason)
				}
			}
		}))
	}
	strict, loose := limiter("100/s burst 5"), limiter("200/s burst 10")
	start := time.Now()
	run := func(l *Redis, from, until time.Duration) {
		time.Sleep(time.Until(start.Add(from)))
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(until))
		defer cancel()
		for ctx.Err() == nil {
			if l.Wait(ctx, "deploy", 1) == nil {
				mu.Lock()
				grants = append(grants, time.Now())
				mu.Unlock()
			}
		}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { run(strict, 0, 3*time.Second) })
		wg.Go(func() { run(loose, 500*time.Millisecond, 6*time.Second) })
	}
	wg.Wait()
	count := func(from, to time.Duration) int {
		n := 0
		for _, g := range grants {
			if d := g.Sub(start); d >= from && d < to {
				n++
			}
		}
		return n
	}
	both, after := count(time.Second, 3*time.Second), count(5*time.Second, 6*time.Second)
	t.Logf("both at once, 1 s to 3 s: %d granted; the loose alone, 5 s to 6 s: %d; told after its start: strict %v, loose %v",
		both, after, told["100/s burst 5"].Sub(start.Add(500*time.Millisecond)), told["200/s burst 10"].Sub(start.Add(500*time.Millisecond)))
	for _, text := range []string{"100/s burst 5", "200/s burst 10"} {
		if at, ok := told[text]; !ok || at.Sub(start) > 1500*time.Millisecond {
			t.Errorf("the %s limiter: told at %v, want within a second of the other's start (0.5 s)", text, at.Sub(start))
		}
	}
	if both > 5+200+1 || both < 190 {
		t.Errorf("both at once: %d granted in 2 s, want the stricter's 100/s: from 190 to b + r t + 1 = 206", both)
	}
	if after < 190 {
		t.Errorf("the loose limiter alone, a second after the stricter's last standing: %d in 1 s, want its own 200/s (190 at least)", after)
	}
}

// TestAnnounceRebooksTheQueue: 100 callers of a limiter at 100/s burst 5
// are asleep in their bookings, a second deep, when another limiter of the
// key at 50/s burst 5 (a reload, a deploy) announces its limit: the
// sleepers book anew, at the stricter limit, and in the second from
// 100 ms after the announcement at most b + r t of it go (5 + 50 + 1);
// none is lost, and the queue goes at the new limit, none of its time
// lost (80 at 50/s: 1.6 s, within 2 s).
func TestAnnounceRebooksTheQueue(t *testing.T) {
	besideOthers(t)
	addr := newTestRedis(t).Options().Addr
	old := mustRedis(t, redistest.ClientOf(t, addr), mustParseLimit(t, "100/s burst 5"), WithFleetSize(1), sharedOnly)
	next := mustRedis(t, redistest.ClientOf(t, addr), mustParseLimit(t, "50/s burst 5"), WithFleetSize(1), sharedOnly)
	var mu sync.Mutex
	var grants []time.Time
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if err := old.Wait(context.Background(), "reload", 1); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			grants = append(grants, time.Now())
			mu.Unlock()
		})
	}
	time.Sleep(200 * time.Millisecond) // all booked, the queue a second deep
	announced := time.Now()
	if err := next.Announce(context.Background(), "reload"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	from := announced.Add(100 * time.Millisecond)
	n := 0
	for _, g := range grants {
		if !g.Before(from) && g.Before(from.Add(time.Second)) {
			n++
		}
	}
	t.Logf("%d granted, %d in the second from 100 ms after the announcement, the last %v after it", len(grants), n, slices.MaxFunc(grants, time.Time.Compare).Sub(announced))
	if last := slices.MaxFunc(grants, time.Time.Compare).Sub(announced); len(grants) != 100 || n > 5+50+1 || n < 45 || last > 2*time.Second {
		t.Errorf("%d of 100 granted, %d in the second after the announcement, the last %v after it; want all, 45 to b + r t + 1 = 56, and within 2 s (80 at 50/s: 1.6 s)", len(grants), n, last)
	}
}

// TestLimitsReadWhileTheyDiffer: a fleet whose processes agree reads the
// limits' record once in half a second a key and process, not at every
// booking (one GET a booking, the bucket's); once another limit is
// announced for the key, every booking reads it, and keeps the stricter.
func TestLimitsReadWhileTheyDiffer(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	own := mustRedis(t, c, PerSecond(1e5).WithBurst(1000), WithFleetSize(1), sharedOnly)
	gets := func(t *testing.T, n int) (int64, time.Duration) {
		t.Helper()
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range n {
			if err := own.Wait(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		stats, err := redistest.CommandStats(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return stats["get"].Calls, elapsed
	}
	const n = 200
	got, elapsed := gets(t, n)
	announces := 1 + int64(elapsed/(500*time.Millisecond))
	t.Logf("agreeing: %d bookings in %v, %d GETs", n, elapsed, got)
	if got > n+announces {
		t.Errorf("agreeing: %d GETs for %d bookings in %v, want at most one a booking and %d for the limits", got, n, elapsed, announces)
	}
	other := mustRedis(t, c, PerSecond(5e4).WithBurst(500), WithFleetSize(1), sharedOnly)
	if err := other.Announce(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if differ, err := c.Exists(ctx, "pace:{k}#differ").Result(); err != nil || differ != 1 {
		t.Fatalf("after another limit's announcement, the key's #differ: %d, %v; want it there", differ, err)
	}
	got, elapsed = gets(t, n)
	t.Logf("disagreeing: %d bookings in %v, %d GETs", n, elapsed, got)
	if got < 2*n {
		t.Errorf("disagreeing: %d GETs for %d bookings, want the limits read at each (%d at least)", got, n, 2*n)
	}
}
