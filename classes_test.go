package pace

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/quotaapi"
)

// TestClassesKeepRoomForCritical: behind 40 batch waiters at 50/s burst 1
// (0.8 s of backlog), a critical request waits at most two token intervals;
// the batch waiters all go, most in about the order they came: by the
// first turn the line gave each (or the time it was booked for, when its
// class did not defer it), not by the order they booked in, which a
// loaded machine shuffles (a waiter that wakes after the next one's turn
// books after it: 28 of 40 near their place once, beside a CPU hog) nor of
// their wake-ups; a batch request whose turn would pass its deadline is
// refused at once (one whose goroutine ran so late that the schedule came
// within its class's horizon books within it, as the class allows). Each
// is measured on the limiter's clock, as booked, not by when its goroutine
// ran: the critical request by the delay it was booked, the line by the
// last turn it gave, the refusal by its kind.
//
// The same holds under a daily cap beside the per-second limit (the
// README's AllOf): the horizon is sized by the per-second limit, which
// binds, not by the daily one (there the critical request waited 444-448
// ms, where two intervals are 40 ms, and the backlog of 0.8 s took 13 s,
// its line's turns 864 ms apart).
func TestClassesKeepRoomForCritical(t *testing.T) {
	besideOthers(t)
	const interval = 20 * time.Millisecond
	var joined atomic.Int32   // batch requests booked or deferred
	var dues sync.Map         // each batch waiter's first turn, or its booked time, by its number
	var critical atomic.Int64 // the critical request's booked delay
	var newcomer atomic.Int64 // the last batch request's booked delay, -1 for none
	observe := WithObserver(func(ctx context.Context, e Event) {
		if classOf(ctx) == ClassCritical && e.Kind == EventWait {
			critical.Store(int64(e.Delay))
		}
		if ctx.Value(newcomerKey{}) != nil && e.Kind == EventWait {
			newcomer.Store(int64(e.Delay))
		}
		if classOf(ctx) == ClassBatch && (e.Kind == EventWait || e.Kind == EventClass) {
			joined.Add(1)
		}
		if i, ok := ctx.Value(waiterKey{}).(int); ok && (e.Kind == EventWait || e.Kind == EventClass) {
			dues.LoadOrStore(i, time.Now().Add(e.Delay))
		}
	})
	perSecond := PerSecond(50).WithBurst(1)
	for quotaName, q := range map[string]Quota{"per second": perSecond, "under a daily cap": AllOf(perSecond, Per(100000, 24*time.Hour))} {
		for name, l := range slotters(t, q, observe) {
			t.Run(quotaName+"/"+name, func(t *testing.T) { checkRoomForCritical(t, l, interval, &joined, &dues, &critical, &newcomer) })
		}
	}
}

// waiterKey is the context key of a batch waiter's number; newcomerKey
// marks the batch request that comes after the critical one.
type (
	waiterKey   struct{}
	newcomerKey struct{}
)

// checkRoomForCritical is TestClassesKeepRoomForCritical on l, whose
// interval is interval; joined counts the batch requests that booked or
// deferred, dues keeps the first turn of each (or the time it was booked
// for), by its number, critical the critical request's booked delay, and
// newcomer the delay the last batch request was booked, if it was.
func checkRoomForCritical(t *testing.T, l Limiter, interval time.Duration, joined *atomic.Int32, dues *sync.Map, critical, newcomer *atomic.Int64) {
	batch := WithClass(context.Background(), ClassBatch)
	joined.Store(0)
	dues.Clear()
	critical.Store(-1)
	newcomer.Store(-1)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range 40 {
		wg.Go(func() {
			if err := l.Wait(context.WithValue(batch, waiterKey{}, i), "k", 1); err != nil {
				t.Error(err)
			}
		})
		for joined.Load() <= int32(i) { // in the line in turn
			time.Sleep(time.Millisecond)
		}
	}
	if err := l.Wait(WithClass(context.Background(), ClassCritical), "k", 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.WithValue(batch, newcomerKey{}, true), 100*time.Millisecond)
	start := time.Now()
	err := l.Wait(ctx, "k", 1)
	refusedIn := time.Since(start)
	cancel()
	wg.Wait()
	var order []int // the batch waiters, by their first turn
	dues.Range(func(i, _ any) bool { order = append(order, i.(int)); return true })
	slices.SortFunc(order, func(a, b int) int {
		at, _ := dues.Load(a)
		bt, _ := dues.Load(b)
		return at.(time.Time).Compare(bt.(time.Time))
	})
	if len(order) > 0 {
		last, _ := dues.Load(order[len(order)-1])
		if took := last.(time.Time).Sub(began); took > 2*41*interval {
			t.Errorf("the line gave the 40 batch waiters their turns over %v, want about %v: the line's turns spaced by the limit that binds", took, 41*interval)
		}
	}
	booked := time.Duration(critical.Load())
	t.Logf("the critical request was booked to wait %v behind 40 batch waiters; a batch request with 100 ms to spare was refused in %v: %v", booked, refusedIn, err)
	if booked < 0 || booked > 2*interval {
		t.Errorf("the critical request was booked to wait %v (-1ns: not granted), want at most two intervals (%v)", booked, 2*interval)
	}
	var deadline *DeadlineError // refused as booked, not by its context's end
	switch booked := time.Duration(newcomer.Load()); {
	case err == nil && booked >= 0 && booked <= interval/2:
		// It came once the critical request's booking was within its
		// class's horizon (the goroutine ran late: 11 ms after the
		// critical request's turn once, in a loaded make test), and booked
		// as its class allows, the line's waiters deferred.
		t.Logf("the batch request came when the schedule was %v ahead, within its horizon (%v), and booked", booked, interval/2)
	case !errors.As(err, &deadline):
		t.Errorf("a batch request whose turn passes its deadline: %v after %v (booked %v, -1ns: not), want a *DeadlineError at once, or a booking within its horizon (%v)", err, refusedIn, booked, interval/2)
	}
	near := 0 // within 3 places of where they came
	for at, i := range order {
		if at-i <= 3 && i-at <= 3 {
			near++
		}
	}
	if len(order) != 40 || near < 30 {
		t.Errorf("batch waiters went in order %v, want all 40, at least 30 of them within 3 places of the order they came", order)
	}
}

// TestHorizonBadInput: bad horizons are errors that name the value.
func TestHorizonBadInput(t *testing.T) {
	for _, tc := range []struct {
		o    Option
		want string
	}{
		{WithHorizon(ClassCritical, time.Second), "WithHorizon(critical, 1s)"},
		{WithHorizon(ClassBatch, -time.Second), "WithHorizon(batch, -1s)"},
		{WithHorizon(Class(9), time.Second), "Class(9)"},
	} {
		if _, err := NewLocal(PerSecond(1), tc.o); err == nil || !errorHas(err, tc.want) {
			t.Errorf("%v, want an error with %q", err, tc.want)
		}
	}
}

// TestFleetPriorities: 4 limiters (as 4 processes would) on one real Redis
// keep a backlog of 600 batch requests (30 s at 20/s) through Transports
// to an upstream that enforces 20/s strictly; critical requests come 5 a
// second beside them. Each critical request waits at most two token
// intervals (100 ms); the batch requests get at least 95% of what the
// critical ones leave; the upstream answers no 429.
func TestFleetPriorities(t *testing.T) {
	const (
		rate     = 20
		backlog  = 600
		settle   = 2 * time.Second // for the backlog to line up, joining over the first 1.5 s
		length   = 4 * time.Second
		interval = time.Second / rate
	)
	c := newTestRedis(t)
	api := startQuotaAPI(t, quotaapi.Config{Rate: rate, Burst: 2})
	limit := PerSecond(rate).WithBurst(1)
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	defer base.CloseIdleConnections()
	ctx, stop := context.WithCancel(WithClass(context.Background(), ClassBatch))
	var fallbacks atomic.Int32
	observe := WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventFallback {
			fallbacks.Add(1)
		}
	})
	var wg sync.WaitGroup
	var clients []*http.Client
	for range 4 {
		clients = append(clients, &http.Client{Transport: &Transport{Base: base, Limiter: mustRedis(t, c, limit, WithFleetSize(4), observe)}})
	}
	for i := range backlog {
		wg.Go(func() {
			for ctx.Err() == nil {
				get(ctx, clients[i%4], api.URL())
			}
		})
		time.Sleep(time.Second / backlog)
	}
	var waits []time.Duration
	critical := mustRedis(t, c, limit, WithFleetSize(4), WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventWait {
			waits = append(waits, e.Delay)
		}
	}))
	criticalClient := &http.Client{Transport: &Transport{Base: base, Limiter: critical}}
	time.Sleep(settle)
	from := time.Now()
	for range int(length / (200 * time.Millisecond)) {
		next := time.Now().Add(200 * time.Millisecond)
		get(WithClass(context.Background(), ClassCritical), criticalClient, api.URL())
		time.Sleep(time.Until(next))
	}
	to := time.Now()
	stop()
	wg.Wait()

	all := tallyOf(api.Arrivals(), from, to)
	batch := all.ok - len(waits)
	left := rate*to.Sub(from).Seconds() - float64(len(waits))
	t.Logf("critical: %d requests, longest wait %v (all: %v); batch: %d of the %.0f left (%.1f%%); 429s: %d; fallbacks: %d",
		len(waits), slices.Max(waits), waits, batch, left, 100*float64(batch)/left, all.refused, fallbacks.Load())
	if slices.Max(waits) > 2*interval {
		t.Errorf("a critical request waited %v, want at most two intervals (%v)", slices.Max(waits), 2*interval)
	}
	if float64(batch) < 0.95*left || all.refused > 0 {
		t.Errorf("batch got %d of the %.0f left, with %d 429s; want at least 95%%, and none", batch, left, all.refused)
	}
	if api.Counts().Refused > 0 || fallbacks.Load() > 0 {
		t.Errorf("the upstream answered %d 429s in the whole run, and the limiters fell back %d times; want none", api.Counts().Refused, fallbacks.Load())
	}
}

// get sends a GET to url with ctx through client, and closes the body.
func get(ctx context.Context, client *http.Client, url string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}
}
