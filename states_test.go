package pace

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
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

// TestStateRestartedEmpty: Redis restarted empty (its scripts and buckets
// gone, as after a failover to a fresh replica). It heals: NOSCRIPT is
// answered with EVAL, and the bucket starts again, full.
func TestStateRestartedEmpty(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := stateClient(t, srv)
	log := &eventLog{}
	r := mustRedis(t, c, PerSecond(1000).WithBurst(5), WithObserver(log.observe), WithCooldown(10*time.Millisecond, 50*time.Millisecond))
	for range 5 {
		if err := r.Wait(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart()
	took := waitForRedis(t, r, log, 2*time.Second)
	calls, err := redistest.CommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if calls["eval"].Calls != 1 {
		t.Errorf("commandstats after the restart: %v, want one EVAL (the answer to NOSCRIPT)", calls)
	}
	t.Logf("back on Redis %v after the restart", took)
}

// TestStateForeignData: a foreign value or type at a bucket's key is an
// error that names the key, returned to that caller alone: it is not an
// outage, and other keys go on through Redis.
func TestStateForeignData(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	log := &eventLog{}
	r := mustRedis(t, c, PerSecond(10), WithObserver(log.observe))
	c.Set(ctx, r.bucketKey("text"), "not a number", 0)
	c.LPush(ctx, r.bucketKey("list"), "x")
	for key, want := range map[string]string{"text": "not a number", "list": "WRONGTYPE"} {
		err := r.Wait(ctx, key, 1)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), key) {
			t.Errorf("Wait on key %q holding a foreign value: %v, want an error naming the key and saying %q", key, err, want)
		}
	}
	if e, ok := log.last(EventFallback); ok {
		t.Errorf("a foreign value was taken for an outage: %+v", e)
	}
	if err := r.Wait(ctx, "good", 1); err != nil {
		t.Fatal(err)
	}
	if e, _ := log.last(EventWait); e.Limiter != "redis" || e.Key != "good" {
		t.Errorf("the next key was decided by %q, want redis", e.Limiter)
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
				if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
					t.Errorf("FailClosed: %v, want an error wrapping ErrUnavailable that says OOM", err)
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
