package pace

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
)

// llmQuota is an LLM API's quota: requests and tokens, 1,000 tokens a
// second with a burst of 1,000 (a token a millisecond).
var llmQuota = AllOf(PerSecond(100).Named("requests"), PerSecond(1000).WithBurst(1000).Named("tokens"))

// tokensDue returns how long a request of cost tokens would wait now on
// lim, from the refusal of a wait under a budget of nothing (a deadline,
// however short, may pass before the call on a loaded machine), which
// books nothing.
func tokensDue(t *testing.T, lim backend, key string, tokens int) time.Duration {
	t.Helper()
	_, err := lim.Reserve(WithWaitBudget(context.Background(), 0), key, Costs{"tokens": tokens})
	var de *DeadlineError
	if !errors.As(err, &de) {
		t.Fatalf("a wait for %d tokens under a budget of nothing: %v, want a refusal", tokens, err)
	}
	return de.Delay
}

// TestSettle: on Redis and on Local, a reservation settled below its
// estimate gives the difference back at once, above it charges a debt (an
// actual cost beyond the burst is capped at it, and the observer hears
// so), a second settlement changes nothing, and one never settled stays at
// its estimate. The costs under each limit are their own:
// the requests limit is charged 1 a reservation throughout.
func TestSettle(t *testing.T) {
	ctx := context.Background()
	log := &eventLog{}
	for name, lim := range map[string]backend{
		"redis": mustRedis(t, newTestRedis(t), llmQuota, WithFleetSize(1), WithObserver(log.observe)),
		"local": mustLocal(t, llmQuota, WithObserver(log.observe)),
	} {
		t.Run(name, func(t *testing.T) {
			// Each step leaves the bucket of 1,000 tokens short of some; a
			// wait for 1,000 tokens then lasts that many milliseconds, less
			// the few that pass between the steps (they refill a token each).
			check := func(step string, want time.Duration) {
				t.Helper()
				if got := tokensDue(t, lim, "k", 1000); got > want || got < want-30*time.Millisecond {
					t.Errorf("%s: a wait for 1000 tokens lasts %v, want about %v", step, got, want)
				}
			}
			first, err := lim.Reserve(ctx, "k", Costs{"tokens": 800})
			if err != nil || first.Delay() != 0 || first.Key() != "k" {
				t.Fatalf("Reserve: %v, %v", first, err)
			}
			check("reserved at 800", 800*time.Millisecond)
			if err := lim.Settle(ctx, first, Costs{"tokens": 300}); err != nil {
				t.Fatal(err)
			}
			check("settled down to 300", 300*time.Millisecond)
			if err := lim.Settle(ctx, first, Costs{"tokens": 1000}); err != nil {
				t.Fatal(err)
			}
			check("settled again, at 1000", 300*time.Millisecond)
			second, err := lim.Reserve(ctx, "k", Costs{"tokens": 100})
			if err != nil {
				t.Fatal(err)
			}
			if err := lim.Settle(ctx, second, Costs{"tokens": 2100}); err != nil {
				t.Fatal(err)
			}
			check("an actual cost beyond the burst, capped at it", 1300*time.Millisecond)
			if e, _ := log.last(EventSettleCapped); e.Cost != 2100 || e.Reason != "tokens: capped at 1000" {
				t.Errorf("the cap was reported as %+v, want the 2100 asked, capped at 1000", e)
			}
			if _, err := lim.Reserve(ctx, "other", Costs{"tokens": 1000}); err != nil {
				t.Fatalf("another key: %v", err)
			}
			unsettled, err := lim.Reserve(ctx, "other", Costs{"requests": 0, "tokens": 0})
			if err != nil || unsettled.Delay() != 0 {
				t.Fatalf("a reservation of nothing: %v, %v", unsettled, err)
			}
		})
	}
}

// TestSettleBookedBeforeSteering: a reservation booked before the
// upstream's counters steered its bucket, and settled after, moves the
// bucket alone (its CEILING, which began at the schedule that had booked
// the estimate) by the difference, as it moves the schedule: counted at
// the estimate and again at the actual cost, each reservation under way
// at a quota's first reading kept its estimate from the fleet (measured:
// examples/llm's fleet left 600 to 1,650 tokens unspent, 0.949 of them
// used, against 200 to 400 before the CEILING bounded bookings).
// For one limit (reserve.lua) and a quota of two (quota.lua).
func TestSettleBookedBeforeSteering(t *testing.T) {
	ctx := context.Background()
	tokens := PerSecond(1000).WithBurst(1000).Named("tokens")
	for name, quota := range map[string]Quota{"one limit": tokens, "a quota": llmQuota} {
		t.Run(name, func(t *testing.T) {
			lim := mustRedis(t, scriptRedis(t), quota, WithFleetSize(1))
			began := time.Now()
			first, err := lim.Reserve(ctx, "k", Costs{"tokens": 800})
			if err != nil {
				t.Fatal(err)
			}
			second, err := lim.Reserve(ctx, "k", Costs{"tokens": 1})
			if err != nil {
				t.Fatal(err)
			}
			// The upstream counted the second alone (the first, of its
			// burst, may arrive after it): 999 left, less the 800 of the
			// first. The key then books 1000 tokens at 852 ms: what is left,
			// less the request's token and the 50 that refill in 50 ms.
			left := []headers.Reading{{Name: "tokens", Remaining: 999, Reset: time.Millisecond, Refills: true, Header: "x-ratelimit-remaining-tokens: 999"}}
			if err := lim.Sync(ctx, second, left, false); err != nil {
				t.Fatal(err)
			}
			if err := lim.Settle(ctx, first, Costs{"tokens": 300}); err != nil {
				t.Fatal(err)
			}
			// The wait counts from the reading, at most what the run's own
			// clock says passed since the first booking before it.
			want := 352*time.Millisecond - time.Since(began)
			if got := tokensDue(t, lim, "k", 1000); got > 352*time.Millisecond || got < want-2*time.Millisecond {
				t.Errorf("settled at 300 of the 800 booked before the reading, 1000 tokens wait %v, want %v (852 ms from the reading, less the 500 given back)", got, want)
			}
		})
	}
}

// TestSettleWhileRedisIsAway: a reservation Redis granted and settled once
// Redis is gone goes to the outage's local pacing, which charges the debt;
// Settle says that Redis never heard of it.
func TestSettleWhileRedisIsAway(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	r := mustRedis(t, srv.Client(t), llmQuota, WithFleetSize(1))
	res, err := r.Reserve(ctx, "k", Costs{"tokens": 500})
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if err := r.Settle(ctx, res, Costs{"tokens": 1000}); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "this process alone") {
		t.Fatalf("Settle with Redis gone: %v, want an error that wraps ErrUnavailable and says the settlement stays here", err)
	}
	// The outage's buckets start empty: 1,000 tokens take a second, and the
	// debt of 500 half a second more.
	if got := tokensDue(t, r, "k", 1000); got < 1400*time.Millisecond || got > 1500*time.Millisecond {
		t.Errorf("after a debt of 500 settled during the outage, 1000 tokens wait %v, want about 1.5s", got)
	}
	if got := tokensDue(t, r, "other", 1000); got > time.Second {
		t.Errorf("another key waits %v, want at most the second an empty bucket takes", got)
	}
}

// TestCostsBadInput: a cost that names no limit of the quota, a negative
// cost, an estimate beyond a limit's burst, a negative actual cost and a
// reservation that another limiter made are errors that name the value, and
// book nothing.
func TestCostsBadInput(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	redisLim := mustRedis(t, c, llmQuota)
	localLim := mustLocal(t, llmQuota)
	for name, lim := range map[string]backend{"redis": redisLim, "local": localLim} {
		t.Run(name, func(t *testing.T) {
			good, err := lim.Reserve(ctx, "k", Costs{"tokens": 10})
			if err != nil {
				t.Fatal(err)
			}
			other, err := map[string]backend{"redis": localLim, "local": redisLim}[name].Reserve(ctx, "k", Costs{"tokens": 10})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			for _, bad := range []struct {
				call func() error
				want string
			}{
				{func() error { _, err := lim.Reserve(ctx, "k", Costs{"words": 1}); return err }, `Costs name "words", which is not a limit of the quota (requests, tokens)`},
				{func() error { _, err := lim.Reserve(ctx, "k", Costs{"tokens": -1}); return err }, `cost -1 under limit "tokens" is below 0`},
				{func() error { _, err := lim.Reserve(ctx, "k", Costs{"tokens": 1001}); return err }, `cost 1001 under limit "tokens" exceeds its burst 1000`},
				{func() error { return lim.Settle(ctx, good, Costs{"tokens": -5}) }, `cost -5 under limit "tokens" is below 0`},
				{func() error { return lim.Settle(ctx, good, Costs{"words": 5}) }, `Costs name "words"`},
				{func() error { return lim.Settle(ctx, other, Costs{"tokens": 5}) }, "a reservation this limiter did not make"},
				{func() error { return lim.Settle(ctx, nil, Costs{"tokens": 5}) }, "a reservation this limiter did not make"},
			} {
				if err := promptly(t, bad.call); err == nil || !strings.Contains(err.Error(), bad.want) {
					t.Errorf("%v, want an error containing %q", err, bad.want)
				}
			}
			calls, err := redistest.CommandStats(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if n := redistest.ScriptCalls(calls); n != 0 {
				t.Errorf("bad costs reached Redis: %d script calls", n)
			}
			if err := lim.Settle(ctx, good, Costs{"tokens": 5}); err != nil {
				t.Errorf("the good reservation, settled after the bad attempts: %v", err)
			}
		})
	}
}

// TestSettlementBounded: a usage object that says a request took 2^40
// tokens (which OpenAIUsage accepts), against a daily quota of a million
// tokens, on Local and on Redis. The actual cost is capped, and the
// observer hears so: under a bucket, so that the debt delays the key by
// the default MaxHold, an hour, at most (a wait past the deadline is
// refused at once, and says so); under a fixed window, at its count, which
// is no outage, and other keys go on.
func TestSettlementBounded(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	daily := AllOf(PerSecond(100).Named("requests"), Per(1e6, 24*time.Hour).Named("tokens"))
	for name, newLimiter := range map[string]func(Option) backend{
		"redis": func(o Option) backend { return mustRedis(t, c, daily, o) },
		"local": func(o Option) backend { return mustLocal(t, daily, o) },
	} {
		t.Run(name, func(t *testing.T) {
			log := &eventLog{}
			lim := newLimiter(WithObserver(log.observe))
			if _, err := lim.Reserve(ctx, "k", Costs{"tokens": 1e6 - 100}); err != nil { // the day's tokens, but 100
				t.Fatal(err)
			}
			res, err := lim.Reserve(ctx, "k", Costs{"tokens": 100})
			if err != nil {
				t.Fatal(err)
			}
			if err := lim.Settle(ctx, res, Costs{"tokens": 1 << 40}); err != nil {
				t.Fatal(err)
			}
			if e, ok := log.last(EventSettleCapped); !ok || e.Cost != 1<<40 {
				t.Errorf("the cap was reported as %+v, %v; want the 2^40 asked", e, ok)
			}
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var de *DeadlineError
			err = promptly(t, func() error { _, err := lim.Reserve(dctx, "k", Costs{"tokens": 1}); return err })
			if !errors.As(err, &de) || de.Delay < 59*time.Minute || de.Delay > time.Hour+time.Minute {
				t.Errorf("the next request: %v; want refused at once, with a wait of an hour: the debt the cap allows", err)
			}
		})
	}
	t.Run("redis/fixed window", func(t *testing.T) {
		log := &eventLog{}
		r := mustRedis(t, c, AllOf(PerSecond(100).Named("requests"), FixedWindow(1e6, 24*time.Hour).Named("tokens")), WithObserver(log.observe))
		res, err := r.Reserve(ctx, "fixed", Costs{"tokens": 100})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(ctx, res, Costs{"tokens": 1e18}); err != nil {
			t.Errorf("Settle of 1e18 tokens: %v, want it capped", err)
		}
		if _, err := r.Reserve(ctx, "other", Costs{"tokens": 1}); err != nil {
			t.Errorf("another key: %v", err)
		}
		if e, ok := log.last(EventFallback); ok {
			t.Errorf("a settlement was taken for an outage: %+v", e)
		}
	})
}

// TestSettlementEvents: on Redis and on Local, a reservation's wait event
// carries its costs under each limit (Cost alone is the first limit's, 1
// request for 900 tokens), its settlement is an event with the estimate
// and the actual costs, and a Settler's cost under a limit the quota
// lacks (OpenAIUsage("token") on a limit named tokens) fails its
// settlement with an event that names the limit, while the reservation
// keeps its estimate.
func TestSettlementEvents(t *testing.T) {
	ctx := context.Background()
	srv := streamServer(t, closedChan())
	for name, newLim := range map[string]func(*testing.T, Observer) backend{
		"redis": func(t *testing.T, o Observer) backend {
			return mustRedis(t, newTestRedis(t), llmQuota, WithFleetSize(1), WithObserver(o))
		},
		"local": func(t *testing.T, o Observer) backend { return mustLocal(t, llmQuota, WithObserver(o)) },
	} {
		t.Run(name, func(t *testing.T) {
			log := &eventLog{}
			lim := newLim(t, log.observe)
			res, err := lim.Reserve(ctx, "k", Costs{"tokens": 900})
			if err != nil {
				t.Fatal(err)
			}
			want := Costs{"requests": 1, "tokens": 900}
			if e, _ := log.last(EventWait); e.Cost != 1 || !maps.Equal(e.Costs, want) {
				t.Errorf("the reservation's wait event: Cost %d, Costs %v; want Costs %v", e.Cost, e.Costs, want)
			}
			if err := lim.Settle(ctx, res, Costs{"tokens": 500}); err != nil {
				t.Fatal(err)
			}
			e, _ := log.last(EventSettle)
			if e.Key != "k" || e.Err != nil || !maps.Equal(e.Estimate, want) || !maps.Equal(e.Costs, Costs{"requests": 1, "tokens": 500}) {
				t.Errorf("the settlement event: %+v, want the estimate %v and 500 tokens", e, want)
			}

			client := &http.Client{Transport: &Transport{Limiter: lim, Key: func(*http.Request) string { return "llm" },
				Estimate: func(*http.Request) Costs { return Costs{"tokens": 400} }, Settle: OpenAIUsage("token")}}
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			e, _ = log.last(EventSettle)
			if e.Key != "llm" || e.Err == nil || !strings.Contains(e.Err.Error(), `Costs name "token", which is not a limit of the quota (requests, tokens)`) || e.Costs != nil {
				t.Errorf("a Settler's cost under no limit of the quota: %+v, want a failed settlement that names the limit", e)
			}
			if got := tokensDue(t, lim, "llm", 1000); got < 350*time.Millisecond {
				t.Errorf("a wait for 1000 tokens lasts %v after the failed settlement, want about 400ms: the estimate kept", got)
			}
		})
	}
}

// closedChan returns a closed channel: a streamServer that sends all at once.
func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
