package pace

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
)

// TestRepayBounded: on a real Redis, a debt books what it owes under each
// kind of limit, and at most what the limit has free and one burst (a
// window's count) more, so that no outage can stop a key for longer than a
// refill period.
func TestRepayBounded(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for _, tc := range []struct {
		limit      Limit
		debt, want int
	}{
		{Per(100, time.Hour), 30, 30},
		{Per(100, time.Hour), 500, 200}, // free 100, and one burst beyond
		{Window(100, time.Hour), 30, 30},
		{Window(100, time.Hour), 500, 200},
		{FixedWindow(100, time.Hour), 30, 30},
		{FixedWindow(100, time.Hour), 500, 200}, // this window full, and the next
	} {
		t.Run(fmt.Sprintf("%v owes %d", tc.limit, tc.debt), func(t *testing.T) {
			r := mustRedis(t, c, tc.limit, WithPrefix(fmt.Sprintf("repay-%d-%d:", tc.limit.kind, tc.debt)), sharedOnly)
			took, err := storeOf(r).Repay(ctx, "k", store.LimitCosts{tc.debt}, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if took[0] != tc.want {
				t.Errorf("took %d units of a debt of %d, want %d", took[0], tc.debt, tc.want)
			}
			// What the debt took is spent: the bucket or window has
			// 100 - took left now (nothing, once the debt passes it).
			left := max(100-tc.want, 0)
			now, cancel := context.WithTimeout(ctx, time.Second) // a unit's refill takes 36 s
			defer cancel()
			for i := range left {
				if err := r.Wait(now, "k", 1); err != nil {
					t.Fatalf("grant %d of the %d left after the debt: %v", i+1, left, err)
				}
			}
			if err := r.Wait(now, "k", 1); err == nil {
				t.Errorf("a grant beyond the %d left after a debt of %d", left, tc.debt)
			}
			b, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			// Beyond what was free, the debt holds the key back by up to a
			// period more, no further.
			if lo, hi := time.Duration(tc.want-100)*36*time.Second*9/10, 2*time.Hour+time.Minute; b.Delay < lo || b.Delay > hi {
				t.Errorf("the next unit waits %v, want %v to %v", b.Delay, lo, hi)
			}
		})
	}
}

// TestRepaySpendsThroughTheLastTurn: a process returning from an outage
// books its share's turns as arriving then, which leaves the bucket's
// burst free before the last of them (the next booking went 120 ms after
// now, a burst before a turn 200 ms away, at 100/s burst 10). Its
// repayment takes the bucket as spent through that turn and the other
// shares' turns after it (a share's interval: a unit a process), so the
// next booking goes after them; a debt still takes what the bucket has
// free now and one burst (100 ms) more at most.
func TestRepaySpendsThroughTheLastTurn(t *testing.T) {
	ctx := context.Background()
	c := scriptRedis(t)
	const unit = 10 * time.Millisecond
	for _, tc := range []struct {
		turn               time.Duration
		shares, debt, took int
		next               time.Duration // after the repayment, the next booking's delay, give or take a unit
	}{
		{200 * time.Millisecond, 1, 0, 0, 220 * time.Millisecond},
		{200 * time.Millisecond, 4, 0, 0, 250 * time.Millisecond},
		{200 * time.Millisecond, 1, 50, 0, 220 * time.Millisecond}, // spent beyond one burst more already
		{50 * time.Millisecond, 1, 50, 4, 110 * time.Millisecond},  // spent through 160 ms, 4 units more to 200 ms
	} {
		t.Run(fmt.Sprintf("turn %v shares %d debt %d", tc.turn, tc.shares, tc.debt), func(t *testing.T) {
			r := mustRedis(t, c, mustParseLimit(t, "100/s burst 10"), WithFleetSize(1), sharedOnly, WithPrefix(fmt.Sprintf("spent-%v-%d-%d-%s:", tc.turn, tc.shares, tc.debt, time.Now().Format("150405.000000"))))
			q := store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}
			if _, err := storeOf(r).Reserve(ctx, q, time.Second, tc.turn); err != nil { // the returning turn
				t.Fatal(err)
			}
			took, err := storeOf(r).Repay(ctx, "k", store.LimitCosts{tc.debt}, tc.turn, tc.shares)
			if err != nil {
				t.Fatal(err)
			}
			b, err := storeOf(r).Reserve(ctx, q, time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			if took[0] != tc.took || b.Delay < tc.next-unit || b.Delay > tc.next+unit {
				t.Errorf("a debt of %d after a turn %v away took %d, and the next booking waits %v; want %d, and %v give or take %v", tc.debt, tc.turn, took[0], b.Delay, tc.took, tc.next, unit)
			}
		})
	}
}

// TestLoneOutageRepays: one process of two loses its link to Redis while
// the other books the whole quota in Redis; back on Redis, the first books
// what it granted alone, so that over the run the fleet stays within its
// quota's b + r*t. The link comes back once the lone process has granted
// tenLocal alone, however long its breaker took to confirm the outage on
// this machine (up to its bound), and the run goes on until the lone
// process has had the time to return and repay.
func TestLoneOutageRepays(t *testing.T) {
	besideOthers(t)
	ctx := context.Background()
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	// A quota of a period (as an hour's, shortened): its burst is the
	// period's count, so a lone outage's grants fit in its debt.
	const rate, burst, tenLocal = 20, 60, 10
	limit := Per(burst, burst/rate*time.Second)
	var repaid atomic.Int64
	story := &outageStory{start: time.Now()}
	observe := WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventRepay && e.Err == nil {
			repaid.Add(int64(e.Cost))
		}
		story.note(e)
	})
	opts := []Option{WithFleetSize(2), WithCooldown(50*time.Millisecond, 100*time.Millisecond)}
	lone := mustRedis(t, redistest.ClientOf(t, proxy.Addr), limit, append(opts, observe)...)
	other := mustRedis(t, srv.Client(t), limit, opts...)

	// The run lasts 6 s, and at least comeBack after the link is back: the
	// lone process returns, and books what it granted alone. Its breaker
	// confirms the outage within 3 x 1.25 call timeouts (a second each at
	// most) of the link's loss, and it grants tenLocal alone a second later
	// at its share; in a loaded make test this took over 3 s once.
	const run, comeBack, confirmed = 6 * time.Second, 2500 * time.Millisecond, 5 * time.Second
	start := time.Now()
	var end atomic.Int64
	end.Store(start.Add(run).UnixNano())
	running := func() bool { return time.Now().UnixNano() < end.Load() }
	var mu sync.Mutex
	var grants, local int
	wentLocal := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range []*Redis{lone, other} {
		wg.Go(func() {
			for running() {
				g, err := r.waitGrant(ctx, "k", 1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if running() {
					grants++
					if g.booking.limiter == "local" {
						if local++; local == tenLocal {
							close(wentLocal)
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	lost := time.Now()
	proxy.SetLatency(3 * time.Second) // the lone process's calls time out
	select {
	case <-wentLocal:
	case <-time.After(confirmed):
	}
	alone := time.Since(lost)
	proxy.SetLatency(0)
	end.Store(max(end.Load(), time.Now().Add(comeBack).UnixNano()))
	wg.Wait()
	length := time.Duration(end.Load() - start.UnixNano())
	bound := burst + rate*length.Seconds()
	t.Logf("%d grants in %v (b + r*t = %.0f), %d of them local; %d units repaid", grants, length.Round(time.Millisecond), bound, local, repaid.Load())
	if local < tenLocal {
		t.Fatalf("%d local grants in %v of a lost link: the lone process did not fall back; its outage's events, from the start:\n%s", local, confirmed, story.told())
	}
	t.Logf("%d local grants %v after the link was lost", tenLocal, alone.Round(time.Millisecond))
	if repaid.Load() < int64(local)*3/4 {
		t.Errorf("%d units repaid of %d granted locally", repaid.Load(), local)
	}
	if float64(grants) > bound+3 {
		t.Errorf("%d grants, beyond b + r*t = %.0f by more than 3", grants, bound)
	}
}

// outageStory keeps the events of a limiter's outages (falling back,
// probing, coming back, failed calls), each timed from start, so that a
// test of an outage that did not go as it should says how it went.
type outageStory struct {
	start time.Time
	mu    sync.Mutex
	lines strings.Builder
}

func (s *outageStory) note(e Event) {
	switch e.Kind {
	case EventFallback, EventProbe, EventRecover, EventFail:
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(&s.lines, "%v %v %v\n", time.Since(s.start).Round(time.Millisecond), e.Kind, e.Err)
}

// told returns the events noted, a line each.
func (s *outageStory) told() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lines.String()
}
