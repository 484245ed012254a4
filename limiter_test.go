package pace

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// promptly runs f and fails the test if f blocks for more than a second.
func promptly(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Second):
		t.Fatal("the call blocked for more than a second")
		return nil
	}
}

// TestBadInputs: every impossible request is an error that names the value,
// returned at once, without a word to Redis.
func TestBadInputs(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	badLimits := map[string]struct {
		limit Limit
		want  string
	}{
		"rate 0":        {PerSecond(0), "count 0 "},
		"rate negative": {PerSecond(-5), "count -5 "},
		"rate NaN":      {PerSecond(math.NaN()), "count NaN "},
		"rate +Inf":     {PerSecond(math.Inf(1)), "count +Inf "},
		"burst 0":       {PerSecond(10).WithBurst(0), "burst 0 "},
		"zero Limit":    {Limit{}, "count 0 "},
		"period 0":      {Per(5, 0), "period 0s "},
		"too fast":      {PerSecond(2e6), "rate 2e+06/s"},
		"slow refill":   {Per(1, 24*time.Hour).WithBurst(1000), "burst 1000 "},
	}
	for name, tc := range badLimits {
		t.Run(name, func(t *testing.T) {
			if _, err := NewRedis(c, tc.limit); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewRedis(%s): %v, want an error containing %q", tc.limit, err, tc.want)
			}
			if _, err := NewLocal(tc.limit); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewLocal(%s): %v, want an error containing %q", tc.limit, err, tc.want)
			}
		})
	}
	badQuotas := map[string]struct {
		quota Quota
		want  string
	}{
		"window of zero length":     {Window(5, 0), "period 0s "},
		"window of negative length": {FixedWindow(5, -time.Second), "period -1s "},
		"window count 0":            {Window(0, time.Second), "count 0 "},
		"window count negative":     {FixedWindow(-2, time.Second), "count -2 "},
		"window over a year":        {Window(5, 400*24*time.Hour), "longer than a year"},
		"no limits":                 {AllOf(), "a quota of 0 limits"},
		"too many limits":           {AllOf(PerSecond(1), PerSecond(2), PerSecond(3), PerSecond(4), PerSecond(5), PerSecond(6), PerSecond(7), PerSecond(8), PerSecond(9)), "a quota of 9 limits"},
		"a bad limit among good":    {AllOf(PerSecond(10), Window(0, time.Minute)), "count 0 "},
		"nil quota":                 {nil, "no quota"},
		"a name with #":             {PerSecond(1).Named("x#gaps"), `name "x#gaps" may not contain`},
		"a name with a brace":       {PerSecond(1).Named("a}b"), `name "a}b" may not contain`},
		"a count above 2^53":        {Per(1e16, 1000*24*time.Hour), "count 1e+16 is above 2^53"},
		"two limits named alike":    {AllOf(PerSecond(1).Named("a"), PerMinute(10).Named("a")), `two limits of the quota go by the name "a" (1/s and 10/m)`},
		"two limits unnamed alike":  {AllOf(PerSecond(1), PerSecond(1)), `two limits of the quota go by the name "1/s"`},
		"a name that is another's":  {AllOf(PerSecond(1), PerMinute(10).Named("1/s")), `go by the name "1/s"`},
	}
	for name, tc := range badQuotas {
		t.Run(name, func(t *testing.T) {
			if _, err := NewRedis(c, tc.quota); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewRedis(%v): %v, want an error containing %q", tc.quota, err, tc.want)
			}
		})
	}
	if _, err := NewLocal(Window(5, time.Second)); err == nil || !strings.Contains(err.Error(), "5/s sliding") {
		t.Errorf("NewLocal of a window: %v, want an error naming it", err)
	}
	quota := mustRedis(t, c, AllOf(PerSecond(100), Window(3, time.Second)))
	if err := quota.Wait(ctx, "k", 4); err == nil || !strings.Contains(err.Error(), "cost 4 exceeds the burst 3") {
		t.Errorf("a cost above the smallest window: %v", err)
	}
	if _, err := NewRules(Rule{Name: "d", Unlimited: true}, Rule{Name: "big", Limiter: quota, Cost: 4}); err == nil || !strings.Contains(err.Error(), `rule "big": cost 4 exceeds the burst 3`) {
		t.Errorf("a rule whose cost exceeds its smallest limit: %v", err)
	}

	limit := PerSecond(100).WithBurst(10)
	limiters := map[string]Limiter{"redis": mustRedis(t, c, limit), "local": mustLocal(t, limit)}
	badWaits := map[string]struct {
		key  string
		cost int
		want string
	}{
		"cost 0":        {"k", 0, "cost 0 "},
		"cost negative": {"k", -3, "cost -3 "},
		"cost > burst":  {"k", 11, "cost 11 exceeds the burst 10"},
		"empty key":     {"", 1, "empty key"},
		// a megabyte key is quoted by its first 64 bytes and its length
		"a 1 MB key": {strings.Repeat("k", 1<<20), 11, `"` + strings.Repeat("k", 64) + `"... (1048576 bytes): cost 11`},
	}
	for lname, lim := range limiters {
		for name, tc := range badWaits {
			t.Run(lname+"/"+name, func(t *testing.T) {
				err := promptly(t, func() error { return lim.Wait(ctx, tc.key, tc.cost) })
				if err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 200 {
					t.Errorf("Wait(%s, %d): %.300v, want an error of at most 200 bytes containing %q", store.QuoteKey(tc.key), tc.cost, err, tc.want)
				}
			})
		}
	}
	badOptions := map[string]struct {
		build func() error
		want  string
	}{
		"nil client":       {func() error { _, err := NewRedis(nil, limit); return err }, "nil client"},
		"prefix with {":    {func() error { _, err := NewRedis(c, limit, WithPrefix("a{b")); return err }, `"a{b"`},
		"negative maxWait": {func() error { _, err := NewLocal(limit, WithMaxWait(-time.Second)); return err }, "-1s"},
	}
	for name, tc := range badOptions {
		t.Run(name, func(t *testing.T) {
			if err := tc.build(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error containing %q", err, tc.want)
			}
		})
	}

	calls, err := redistest.CommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if redistest.ScriptCalls(calls) != 0 {
		t.Errorf("bad inputs reached Redis: commandstats %v", calls)
	}
}

// TestBadHolds: a hold that is not positive is an error that names it,
// and leaves the key's bucket as it was: empty here. One longer than the
// limiter's MaxHold holds for MaxHold, and the observer hears what was
// asked.
func TestBadHolds(t *testing.T) {
	ctx := context.Background()
	limit := PerSecond(100).WithBurst(10) // 10 ms a token
	log := &eventLog{}
	limiters := map[string]backend{"redis": mustRedis(t, newTestRedis(t), limit, WithObserver(log.observe), WithMaxHold(time.Minute)),
		"local": mustLocal(t, limit, WithObserver(log.observe), WithMaxHold(time.Minute))}
	for lname, lim := range limiters {
		t.Run(lname+"/a century and a day", func(t *testing.T) {
			if err := lim.Hold(ctx, "long", headers.Hold{For: MaxDelay + 24*time.Hour, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			capped, _ := log.last(EventHoldCapped)
			held, _ := log.last(EventHold)
			if capped.Delay != MaxDelay+24*time.Hour || held.Delay != time.Minute {
				t.Errorf("hold reported as %v, capped from %v; want a minute, capped from %v", held.Delay, capped.Delay, MaxDelay+24*time.Hour)
			}
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var de *DeadlineError
			if err := lim.Wait(dctx, "long", 1); !errors.As(err, &de) || de.Delay < 59*time.Second || de.Delay > time.Minute {
				t.Errorf("a wait during the hold: %v, want a refusal of a minute's wait", err)
			}
		})
		for name, tc := range map[string]struct {
			hold headers.Hold
			want string
		}{
			"negative": {headers.Hold{For: -time.Second, Reason: "test"}, "Hold for -1s"},
			"zero":     {headers.Hold{Reason: "test"}, "Hold for 0s"},
		} {
			t.Run(lname+"/"+name, func(t *testing.T) {
				if err := lim.Wait(ctx, name, 10); err != nil { // empty the bucket
					t.Fatal(err)
				}
				if err := lim.Hold(ctx, name, tc.hold); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Hold(%v): %v, want an error containing %q", tc.hold.For, err, tc.want)
				}
				dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				var de *DeadlineError
				if err := lim.Wait(dctx, name, 5); !errors.As(err, &de) {
					t.Errorf("5 tokens of an empty bucket under a 20ms deadline after the hold: %v, want a refusal (the hold must not refill it)", err)
				}
			})
		}
	}
}

// scripterReplying is a redis.Scripter whose every script call replies val,
// to feed the reply parser shapes a real Redis would only send after a bug.
type scripterReplying struct {
	redis.Scripter
	val any
}

func (s scripterReplying) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetVal(s.val)
	return cmd
}

// TestRedisOddReplies: a reply of the wrong shape is a Redis failure, never a
// panic and never a grant from Redis: a FailClosed limiter says so.
func TestRedisOddReplies(t *testing.T) {
	for name, val := range map[string]any{
		"nil":          nil,
		"string":       "OK",
		"short":        []any{int64(1), int64(0), int64(0)},
		"long":         []any{int64(1), int64(0), int64(0), int64(0), int64(0), int64(0)},
		"text inside":  []any{int64(1), "soon", int64(0), int64(0), int64(0)},
		"bad granted":  []any{int64(7), int64(0), int64(0), int64(0), int64(0)},
		"negative":     []any{int64(1), int64(-5), int64(0), int64(0), int64(0)},
		"nested table": []any{[]any{int64(1)}, int64(0), int64(0), int64(0), int64(0)},
	} {
		t.Run(name, func(t *testing.T) {
			r := mustRedis(t, scripterReplying{val: val}, PerSecond(10), WithFailurePolicy(FailClosed))
			if err := r.Wait(context.Background(), "k", 1); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "replied") {
				t.Errorf("reply %#v: Wait returned %v, want an error wrapping ErrUnavailable that quotes the reply", val, err)
			}
		})
	}
}

// TestStoreBounds: the scripts bound the times they write by MaxDelay and
// the longest refill, as the limiters do.
func TestStoreBounds(t *testing.T) {
	if store.MaxDelay != MaxDelay {
		t.Errorf("the store's MaxDelay is %v, the limiters' %v", store.MaxDelay, MaxDelay)
	}
}

// TestWaitBudget: under WithWaitBudget of 0, a wait is granted while a
// token is free, and refused at once, booking nothing, once none is; on
// Local and on Redis.
func TestWaitBudget(t *testing.T) {
	srv := redistest.Start(t)
	for name, l := range map[string]Limiter{"local": mustLocal(t, PerMinute(1).WithBurst(2)), "redis": mustRedis(t, srv.Client(t), PerMinute(1).WithBurst(2))} {
		ctx := WithWaitBudget(context.Background(), 0)
		for i := range 2 {
			if err := l.Wait(ctx, "k", 1); err != nil {
				t.Fatalf("%s: token %d, free: %v", name, i+1, err)
			}
		}
		var late *DeadlineError
		if err := l.Wait(ctx, "k", 1); !errors.As(err, &late) || late.Delay < 59e9 {
			t.Errorf("%s: with none free: %v, want a DeadlineError that says a wait of about a minute", name, err)
		}
	}
}
