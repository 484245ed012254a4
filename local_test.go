package pace

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

func mustLocal(t testing.TB, q Quota, opts ...Option) *Local {
	t.Helper()
	loc, err := NewLocal(q, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// fakeClock is a clock that moves only when the test says.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestLocalEvictsIdleKeys: a crawler that meets 200,000 hosts does not keep
// 200,000 limiters once those hosts are idle and their buckets full again.
func TestLocalEvictsIdleKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	loc := mustLocal(t, PerSecond(10).WithBurst(5)) // refills from empty in 500 ms
	loc.now = clock.Now
	const keys = 200_000
	for i := range keys {
		if err := loc.Wait(ctx, "host-"+strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := loc.Len(); n != keys {
		t.Fatalf("after touching %d keys, Len() = %d", keys, n)
	}

	clock.Advance(999 * time.Millisecond) // buckets full, but a sweep is not due yet
	for i := range 1000 {
		loc.Wait(ctx, "later-"+strconv.Itoa(i), 1)
	}
	if n := loc.Len(); n < keys {
		t.Fatalf("Len() = %d before the sweep period of 1s passed, want all %d kept", n, keys)
	}

	clock.Advance(time.Millisecond)
	for i := range 1000 { // 1000 keys reach every one of the 32 shards
		loc.Wait(ctx, "fresh-"+strconv.Itoa(i), 1)
	}
	if n := loc.Len(); n > 2000 {
		t.Fatalf("Len() = %d after the idle period, want at most the 2000 keys touched since", n)
	}
}

// TestLocalKeepsBusyKeys: a key whose bucket is not yet full is never
// dropped, since a new limiter would start full and overshoot the limit.
func TestLocalKeepsBusyKeys(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	loc := mustLocal(t, Per(2, 10*time.Second), WithMaxWait(time.Millisecond)) // refill: 10 s
	loc.now = clock.Now
	for range 2 {
		if err := loc.Wait(ctx, "busy", 1); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(4 * time.Second) // a sweep is due (1s), the bucket holds 0.8 tokens
	loc.Wait(ctx, "other", 1)
	err := loc.Wait(ctx, "busy", 1)
	var de *DeadlineError
	if !errors.As(err, &de) {
		t.Fatalf("Wait on a key with 0.8 tokens: %v, want a *DeadlineError (the key must not have been reset)", err)
	}
	if want := time.Second; de.Delay > want || de.Delay < want-time.Microsecond {
		t.Errorf("DeadlineError.Delay = %v, want %v for the missing 0.2 token", de.Delay, want)
	}
}

// TestLocalDeadlineAndCancel: a refused wait books nothing; a cancelled wait
// gives its token back.
func TestLocalDeadlineAndCancel(t *testing.T) {
	ctx := context.Background()
	events := make(chan Event, 4)
	loc := mustLocal(t, PerSecond(2).WithBurst(1), WithObserver(func(_ context.Context, e Event) { events <- e })) // 500 ms a token
	if err := loc.Wait(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	<-events
	refusedDelay := func() time.Duration { // a wait under a 50 ms deadline: refused, books nothing
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := loc.Wait(dctx, "k", 1)
		if elapsed := time.Since(start); elapsed >= 5*time.Millisecond {
			t.Errorf("refusal took %v, want under 5ms", elapsed)
		}
		var de *DeadlineError
		if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait under a 50ms deadline: %v, want a *DeadlineError wrapping context.DeadlineExceeded", err)
		}
		if e := <-events; e.Kind != EventRefuse || e.Delay != de.Delay {
			t.Fatalf("event %+v, want a refusal of %v", e, de.Delay)
		}
		return de.Delay
	}
	if d := refusedDelay(); d < 400*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("refused delay %v, want about 500ms", d)
	}

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- loc.Wait(cctx, "k", 1) }()
	if e := <-events; e.Kind != EventWait || e.Delay < 400*time.Millisecond || e.Delay > 500*time.Millisecond {
		t.Fatalf("event %+v, want a booked wait of about 500ms: the refused wait must have booked nothing", e)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v, want an error wrapping context.Canceled", err)
	}
	if e := <-events; e.Kind != EventCancel {
		t.Fatalf("event %+v after the cancel, want EventCancel", e)
	}
	if d := refusedDelay(); d > 500*time.Millisecond {
		t.Errorf("after the cancel the next caller would wait %v, want under 500ms: the token was not given back", d)
	}
}

// TestLocalKeepsTheBound: 8 goroutines on one key at 200/s burst 10 for a
// second are granted at most 10 + 200*t + 1 and at least 97% of 200*t.
func TestLocalKeepsTheBound(t *testing.T) {
	besideOthers(t)
	loc := mustLocal(t, PerSecond(200).WithBurst(10))
	from := time.Now()
	grants, err := runWorkers(8, from.Add(time.Second), func(ctx context.Context) error { return loc.Wait(ctx, "k", 1) })
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, from, grants, 200, 10)
}

// errRunOver, from a worker's wait, ends that worker without a grant.
var errRunOver = errors.New("the run is over")

// runWorkers calls wait from n goroutines until end, and returns the times
// of the grants, sorted. Waits have no deadline, so each ends in a grant; the
// first error stops the run.
func runWorkers(n int, end time.Time, wait func(context.Context) error) ([]time.Time, error) {
	var mu sync.Mutex
	var grants []time.Time
	var errs []error
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				err := wait(context.Background())
				if errors.Is(err, errRunOver) {
					return
				}
				now := time.Now()
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					grants = append(grants, now)
				}
				mu.Unlock()
				if err != nil || now.After(end) {
					return
				}
			}
		})
	}
	wg.Wait()
	slices.SortFunc(grants, time.Time.Compare)
	return grants, errors.Join(errs...)
}

// checkGrants holds sorted grant times to the token bucket's promise over
// the span t from, an instant before any of them was decided (the bucket
// full), to the last: at most burst + rate*t (+1 to spare), and at least 97%
// of rate*t. The span starts at from, not at the first grant, because a
// caller returns a little after its time, and the first one's lateness
// would shorten the span and make the bound stricter than the bucket's.
func checkGrants(t *testing.T, from time.Time, grants []time.Time, rate float64, burst int) {
	t.Helper()
	if len(grants) < 2 {
		t.Fatalf("%d grants", len(grants))
	}
	span := grants[len(grants)-1].Sub(from).Seconds()
	n := float64(len(grants))
	t.Logf("%d grants in %.3fs: %.1f/s, bound %.1f, utilisation %.1f%% of %v/s", len(grants), span, n/span, float64(burst)+rate*span+1, 100*(n-float64(burst))/(rate*span), rate)
	if max := float64(burst) + rate*span + 1; n > max {
		t.Errorf("%d grants in %.3fs, more than burst %d + %v*t + 1 = %.1f", len(grants), span, burst, rate, max)
	}
	if min := 0.97 * rate * span; n < min {
		t.Errorf("%d grants in %.3fs, fewer than 97%% of %v*t = %.1f", len(grants), span, rate, min)
	}
}
