package pace

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// Odd Redis states, each reproduced against a real redis-server: the
// limiter heals by itself or says clearly what is wrong, and never panics.

// eventLog records a limiter's events.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) observe(_ context.Context, e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// last returns the last event of kind, and whether there was one.
func (l *eventLog) last(kind EventKind) (Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0; i-- {
		if l.events[i].Kind == kind {
			return l.events[i], true
		}
	}
	return Event{}, false
}

// waitForRedis calls Wait until Redis decides a request again, for at most
// within, and fails the test if it does not.
func waitForRedis(t *testing.T, r *Redis, log *eventLog, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	log.mu.Lock()
	seen := len(log.events)
	log.mu.Unlock()
	for time.Since(start) < within {
		if err := r.Wait(context.Background(), "k", 1); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		log.mu.Lock()
		events := log.events[seen:]
		log.mu.Unlock()
		for _, e := range events {
			if e.Kind == EventWait && e.Limiter == "redis" {
				return time.Since(start)
			}
		}
	}
	t.Fatalf("Redis did not decide a request again within %v", within)
	return 0
}

func stateClient(t *testing.T, srv *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestStateRestartedEmpty: Redis restarted empty (its functions, scripts
// and buckets gone, as after a failover to a fresh replica). It heals: a
// function not found is loaded, once for each script the limiter then
// uses, and the bucket starts again, full.
func TestStateRestartedEmpty(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := stateClient(t, srv)
	loads := &loadCounter{}
	c.AddHook(loads)
	log := &eventLog{}
	r := mustRedis(t, c, PerSecond(1000).WithBurst(5), WithObserver(log.observe), WithCooldown(10*time.Millisecond, 50*time.Millisecond))
	for range 5 {
		if err := r.Wait(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart()
	loads.mu.Lock()
	loads.bySource = map[string]int{}
	loads.mu.Unlock()
	took := waitForRedis(t, r, log, 2*time.Second)
	loads.mu.Lock()
	defer loads.mu.Unlock()
	if len(loads.bySource) == 0 {
		t.Error("no FUNCTION LOAD after the restart: a function not found was not loaded")
	}
	for source, n := range loads.bySource {
		if n != 1 {
			t.Errorf("%d loads of one library after the restart, want one:\n%s", n, source[:min(len(source), 300)])
		}
	}
	t.Logf("back on Redis %v after the restart, with %d libraries loaded again", took, len(loads.bySource))
}

// loadCounter is a go-redis hook that counts the FUNCTION LOAD calls that
// reached Redis, by library. (One sent on a connection the restart broke
// does not.)
type loadCounter struct {
	mu       sync.Mutex
	bySource map[string]int
}

func (e *loadCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (e *loadCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		var redisErr redis.Error
		if args := cmd.Args(); cmd.Name() == "function" && fmt.Sprint(args[1]) == "load" && (err == nil || errors.As(err, &redisErr)) && e.bySource != nil {
			e.mu.Lock()
			e.bySource[fmt.Sprint(args[2])]++
			e.mu.Unlock()
		}
		return err
	}
}

func (e *loadCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestStateForeignData: a foreign value or type at a key pace uses, under
// every kind of limit, is a *KeyError that names the key, returned to that
// key's callers alone, with or without a deadline: never a grant, never an
// outage, and the key is left as it was. Other keys go on through Redis.
func TestStateForeignData(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	log := &eventLog{}
	quotas := map[string]Quota{
		"bucket":         PerSecond(10),
		"sliding window": AllOf(PerSecond(10), Window(5, time.Second)),
		"fixed window":   AllOf(PerSecond(10), FixedWindow(5, time.Second)),
	}
	year2200 := "7258118400000000" // microseconds: a time beyond any wait pace books
	type foreign struct {
		write func(key string) error
		want  string
	}
	text := func(v, want string) foreign {
		return foreign{func(key string) error { return c.Set(ctx, key, v, time.Hour).Err() }, want}
	}
	const notWhole, beyond = "not a whole number", "beyond any pace writes"
	values := map[string]map[string]foreign{
		"bucket": {
			"text":          text("not a number", notWhole),
			"1e300":         text("1e300", beyond),
			"inf":           text("inf", notWhole),
			"nan":           text("nan", notWhole),
			"a fraction":    text("1796000000000000.5", notWhole),
			"hexadecimal":   text("0x7fffffffffffffff", beyond),
			"negative":      text("-5", notWhole),
			"the year 2200": text(year2200, beyond),
			"the year 3000": text("32503680000000000", beyond),
			"a list":        {func(key string) error { return c.RPush(ctx, key, "x").Err() }, "holds a list"},
		},
		"sliding window": {
			"the year 2200": {func(key string) error { return c.ZAdd(ctx, key, redis.Z{Score: 7258118400000000, Member: "x"}).Err() }, beyond},
			"1e300":         {func(key string) error { return c.ZAdd(ctx, key, redis.Z{Score: 1e300, Member: "x"}).Err() }, beyond},
			"a fraction":    {func(key string) error { return c.ZAdd(ctx, key, redis.Z{Score: 0.5, Member: "x"}).Err() }, notWhole},
			"a string":      {func(key string) error { return c.Set(ctx, key, "x", time.Hour).Err() }, "holds a string"},
		},
		"fixed window": {
			"a count that is text": {func(key string) error { // this second's window, and the next (the test may cross into it)
				w := time.Now().Unix()
				return c.HSet(ctx, key, strconv.FormatInt(w, 10), "many", strconv.FormatInt(w+1, 10), "many").Err()
			}, notWhole},
			"a set": {func(key string) error { return c.SAdd(ctx, key, "x").Err() }, "holds a set"},
		},
		// The key's hold, which every booking reads, under every kind.
		"hold": {
			"the year 2200": text(year2200, beyond),
			"text":          text("soon", notWhole),
			"a hash":        {func(key string) error { return c.HSet(ctx, key, "hold", "1").Err() }, "holds a hash"},
		},
	}
	quotas["hold"] = AllOf(PerSecond(10), Window(5, time.Second), FixedWindow(5, time.Second))
	quotas["bucket hold"], values["bucket hold"] = PerSecond(10), values["hold"] // reserve.lua reads it too
	for kind, q := range quotas {
		r := mustRedis(t, c, q, WithObserver(log.observe))
		for name, f := range values[kind] {
			t.Run(kind+"/"+name, func(t *testing.T) {
				key := kind + "/" + name
				keys := storeOf(r).Keys(key, false)
				redisKey := keys[len(keys)-1]
				if strings.HasSuffix(kind, "hold") {
					redisKey = storeOf(r).HoldKey(key)
				}
				if err := f.write(redisKey); err != nil {
					t.Fatal(err)
				}
				dump := c.Dump(ctx, redisKey).Val()
				ttl := c.PTTL(ctx, redisKey).Val()
				for _, budget := range []time.Duration{0, time.Second} {
					wctx, cancel := context.WithCancel(ctx)
					if budget > 0 {
						wctx, cancel = context.WithTimeout(ctx, budget)
					}
					err := promptly(t, func() error { return r.Wait(wctx, key, 1) })
					cancel()
					var keyErr *KeyError
					if !errors.As(err, &keyErr) || keyErr.RedisKey != redisKey || !strings.Contains(err.Error(), f.want) {
						t.Errorf("Wait (deadline %v): %v, want a *KeyError naming %q that says %q", budget, err, redisKey, f.want)
					}
				}
				if c.Dump(ctx, redisKey).Val() != dump || c.PTTL(ctx, redisKey).Val() > ttl {
					t.Errorf("the foreign key was changed")
				}
			})
		}
	}
	if e, ok := log.last(EventFallback); ok {
		t.Errorf("foreign data was taken for an outage: %+v", e)
	}
	r := mustRedis(t, c, PerSecond(10), WithObserver(log.observe))
	if err := r.Wait(ctx, "good", 1); err != nil {
		t.Fatal(err)
	}
	if e, _ := log.last(EventWait); e.Limiter != "redis" || e.Key != "good" {
		t.Errorf("the next key was decided by %q, want redis", e.Limiter)
	}
}

// TestStateFarFuture: a token a year, the slowest rate, and 320 callers
// without a deadline, each decided before the next comes: one is granted at
// once, the next 100 are booked a year apart (MaxDelay is a century), and
// the rest are refused with a wait that says how long, never a negative
// one, on Redis as on Local.
func TestStateFarFuture(t *testing.T) {
	yearly := Every(365 * 24 * time.Hour)
	decided := make(chan Event, 1)
	observe := func(_ context.Context, e Event) {
		if e.Kind == EventWait || e.Kind == EventRefuse {
			decided <- e
		}
	}
	for name, lim := range map[string]Limiter{
		"redis": mustRedis(t, newTestRedis(t), yearly, WithFleetSize(1), WithObserver(observe)),
		"local": mustLocal(t, yearly, WithObserver(observe)),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			errs := make(chan error, 320)
			booked := 0
			for range 320 {
				wg.Go(func() { errs <- lim.Wait(ctx, "k", 1) })
				if e := <-decided; e.Kind == EventWait {
					booked++
					if e.Delay < 0 || e.Delay > MaxDelay {
						t.Errorf("a wait of %v was booked", e.Delay)
					}
				}
			}
			cancel() // the booked waits end now: only the first had gone
			wg.Wait()
			close(errs)
			var granted, refused int
			for err := range errs {
				var de *DeadlineError
				switch {
				case err == nil:
					granted++
				case errors.As(err, &de):
					refused++
					if de.Delay <= MaxDelay || de.Budget != MaxDelay || !strings.Contains(err.Error(), "MaxDelay") {
						t.Errorf("refusal %v: want a wait beyond MaxDelay", err)
					}
				case !errors.Is(err, context.Canceled):
					t.Errorf("Wait: %v", err)
				}
			}
			t.Logf("%d booked (%d granted at once), %d refused", booked, granted, refused)
			if granted != 1 || booked != 101 || refused != 219 {
				t.Errorf("%d booked, %d of them granted at once, %d refused, of 320; want 101 booked (a century of waits), 1 granted at once, 219 refused", booked, granted, refused)
			}
		})
	}
}

// TestStateFixedWindowBacklog: a fixed window of 1 a second with 100
// callers books 64 windows ahead; the callers beyond are refused, as beyond
// any wait (a *DeadlineError): it is not an outage, nor foreign data. (Calls are allowed a
// second: 100 callers at once on a loaded machine can keep one past the
// default 50 ms, which is an outage of its own, not the one asked about.)
func TestStateFixedWindowBacklog(t *testing.T) {
	log := &eventLog{}
	r := mustRedis(t, newTestRedis(t), FixedWindow(1, time.Second), WithObserver(log.observe), WithCallTimeout(time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var beyond atomic.Int32
	for range 100 {
		wg.Go(func() {
			var late *DeadlineError
			if err := r.Wait(ctx, "k", 1); errors.As(err, &late) && late.Delay > MaxDelay {
				beyond.Add(1)
			}
		})
	}
	for deadline := time.Now().Add(5 * time.Second); beyond.Load() < 100-65 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	if n := beyond.Load(); n < 100-65 {
		t.Errorf("%d callers refused as beyond any wait, want the 35 or more beyond 64 windows (and the first)", n)
	}
	if e, ok := log.last(EventFallback); ok {
		t.Errorf("a key's backlog was taken for an outage: %+v", e)
	}
}

// TestStateNoKeyCollides: a key and limit name chosen to meet pace's own
// keys (the heartbeats of fleet "default", a one-bucket limiter's gaps)
// cannot: the fleet's heartbeat and the gaps stay what they are, and no
// outage follows.
func TestStateNoKeyCollides(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	log := &eventLog{}
	named := mustRedis(t, c, PerSecond(100).Named("default"), WithObserver(log.observe))
	gaps := mustRedis(t, c, AllOf(PerSecond(100).Named("gaps"), PerHour(1000)), WithObserver(log.observe))
	for range 3 {
		for _, r := range []*Redis{named, gaps} {
			b, err := storeOf(r).Reserve(ctx, store.Request{Key: "fleet", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.fleet.beat(ctx, r.calls, c.Pipeline(), b.Now); err != nil {
				t.Fatalf("heartbeat beside the key %q: %v", storeOf(r).Keys("fleet", false), err)
			}
			if err := r.Wait(ctx, "fleet", 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if e, ok := log.last(EventFallback); ok {
		t.Errorf("a colliding key made an outage: %+v", e)
	}
	for _, key := range []string{named.fleet.key, storeOf(named).Keys("fleet", true)[1]} {
		for _, user := range append(storeOf(named).Keys("fleet", false), storeOf(gaps).Keys("fleet", false)...) {
			if key == user {
				t.Errorf("pace's own key %q is also a limit's key", key)
			}
		}
	}
}

// TestStateOutOfMemory: Redis at its maxmemory with noeviction refuses the
// script's write with OOM. That is an outage: FailClosed says so with
// ErrUnavailable, FallbackLocal paces locally, and both heal once memory
// is freed.
func TestStateOutOfMemory(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	c := stateClient(t, srv)
	var fillers []string // 4 MB, then a maxmemory of 1 MB
	for i := range 16 {
		fillers = append(fillers, "filler:"+strconv.Itoa(i))
		if err := c.Set(ctx, fillers[i], strings.Repeat("x", 256<<10), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	for _, policy := range []FailurePolicy{FailClosed, FallbackLocal} {
		t.Run(policy.String(), func(t *testing.T) {
			log := &eventLog{}
			r := mustRedis(t, c, PerSecond(1000), WithFailurePolicy(policy), WithObserver(log.observe),
				WithCooldown(10*time.Millisecond, 50*time.Millisecond))
			err := r.Wait(ctx, "k", 1)
			e, fell := log.last(EventFallback)
			if !fell || e.Err == nil || !strings.Contains(e.Err.Error(), "OOM") {
				t.Fatalf("Wait on a Redis out of memory: fallback event %+v, want one whose error says OOM", e)
			}
			switch policy {
			case FailClosed:
				if !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), `pace: key "k": Redis unavailable: reserve script: OOM`) || strings.Count(err.Error(), "pace:") != 1 {
					t.Errorf("FailClosed: %v, want an error wrapping ErrUnavailable that names the key once, then the script and OOM", err)
				}
			case FallbackLocal:
				if w, _ := log.last(EventWait); err != nil || w.Limiter != "local" {
					t.Errorf("FallbackLocal: %v, decided by %q; want a local grant", err, w.Limiter)
				}
			}
		})
	}
	t.Run("freed", func(t *testing.T) {
		log := &eventLog{}
		r := mustRedis(t, c, PerSecond(1000), WithObserver(log.observe), WithCooldown(10*time.Millisecond, 50*time.Millisecond))
		r.Wait(ctx, "k", 1)
		if _, fell := log.last(EventFallback); !fell {
			t.Fatal("no fallback while out of memory")
		}
		c.Del(ctx, fillers...)
		c.ConfigSet(ctx, "maxmemory", "0") // Redis's own use alone is near 1 MB
		waitForRedis(t, r, log, time.Second)
		if _, ok := log.last(EventRecover); !ok {
			t.Error("back on Redis without an EventRecover")
		}
	})
}

// TestStateBusyScript: another client's script that runs too long makes
// Redis answer BUSY. That is an outage until the script is killed; then the
// limiter heals.
func TestStateBusyScript(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--busy-reply-threshold", "20")
	c := stateClient(t, srv)
	busy := srv.Client(t)
	busyDone := make(chan error, 1)
	go func() { busyDone <- busy.Eval(ctx, "while true do end", nil).Err() }()
	for start := time.Now(); ; { // until Redis answers BUSY
		err := c.Ping(ctx).Err()
		if err != nil && strings.HasPrefix(err.Error(), "BUSY") {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("Redis did not get busy: PING says %v", err)
		}
	}

	log := &eventLog{}
	r := mustRedis(t, c, PerSecond(1000), WithFailurePolicy(FailClosed), WithObserver(log.observe),
		WithCooldown(10*time.Millisecond, 50*time.Millisecond))
	if err := r.Wait(ctx, "k", 1); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "BUSY") {
		t.Errorf("Wait while a script is busy: %v, want an error wrapping ErrUnavailable that says BUSY", err)
	}

	if err := c.ScriptKill(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-busyDone; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("the busy script ended with %v, want it killed", err)
	}
	start := time.Now()
	for time.Since(start) < time.Second {
		if err := r.Wait(ctx, "k", 1); err == nil {
			break
		}
	}
	if _, ok := log.last(EventRecover); !ok {
		t.Errorf("no recovery within a second after SCRIPT KILL")
	}
}
