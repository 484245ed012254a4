package pace

import (
	"slices"
	"testing"
	"time"
)

// The token fleet: 4 processes of 8 goroutines make LLM calls on one key
// under 600 requests and 60,000 tokens a minute (bursts of 10 and 2,000),
// each estimated at 400 tokens and using from 100 to 400, settled 200 ms
// after its grant, as a response ends.
const (
	tokenRate      = 1000.0 // a second
	tokenBurst     = 60000
	tokenEstimate  = 400
	tokenFleetTime = 6 * time.Second
)

// llmCall is one call of the token fleet, as the test reads it.
type llmCall struct {
	granted, settled time.Time // settled is zero when it never was
	estimate, actual int
}

// TestTokenFleet: with settling, the tokens the fleet actually used stay
// within the bound, and it uses at least 95% of what the bound allows;
// without, it wastes what the estimates overstate.
func TestTokenFleet(t *testing.T) {
	besideOthers(t)
	for _, settle := range []bool{true, false} {
		t.Run(map[bool]string{true: "settled", false: "not settled"}[settle], func(t *testing.T) {
			t.Parallel() // 4 processes of 8 goroutines at 10 calls/s: each sleeps most of its time
			c := newTestRedis(t)
			from := time.Now()
			start := from.Add(time.Second) // time for the processes to start
			reports, _ := runFleet(t, 4, fleetWorker{
				Addr: c.Options().Addr, Key: "llm.example.com:443", Goroutines: 8, StopAtEnd: true,
				Start: start, End: start.Add(tokenFleetTime),
				Tokens: &tokenRun{Requests: "600/m", Tokens: "60000/m",
					Estimate: tokenEstimate, ActualMin: 100, ActualMax: 400, Response: 200 * time.Millisecond, Settle: settle},
			})
			checkNoErrors(t, reports)
			var calls []llmCall
			for _, r := range reports {
				for _, q := range r.Requests {
					calls = append(calls, llmCall{q.End, q.Settled, q.Estimate, q.Actual})
				}
			}
			slices.SortFunc(calls, func(a, b llmCall) int { return a.granted.Compare(b.granted) })
			checkTokenBound(t, calls)
			used := 0
			for _, call := range calls {
				used += call.actual
			}
			span := calls[len(calls)-1].granted.Sub(start).Seconds()
			utilisation := float64(used) / (tokenBurst + tokenRate*span)
			t.Logf("%d calls in %.2fs used %d tokens: %.1f%% of burst + rate*t (%.0f)", len(calls), span, used, 100*utilisation, tokenBurst+tokenRate*span)
			if settle && utilisation < 0.95 {
				t.Errorf("settled: %.1f%% of the tokens the limit allows used, want at least 95%%", 100*utilisation)
			}
			if !settle && utilisation > 0.8 {
				t.Errorf("not settled: %.1f%% used; the estimates overstate the use by a third or more, so it should fall well below 80%%", 100*utilisation)
			}
		})
	}
}

// checkTokenBound holds the calls, sorted by grant, to the bound the
// README states: the tokens actually used by the calls granted within any
// span [t1, t2] are at most burst + rate*(t2-t1), plus what the calls granted
// before t1 gave back within the span (their estimates less their use),
// plus what the calls granted within it were charged after t2 (their use
// beyond the estimate; none here), plus one estimate for the jitter between
// a grant and the time its process noted it.
func checkTokenBound(t *testing.T, calls []llmCall) {
	t.Helper()
	worst := -1e18
	for i := range calls {
		used := 0
		for j := i; j < len(calls); j++ {
			t1, t2 := calls[i].granted, calls[j].granted
			used += calls[j].actual
			allowed := tokenBurst + tokenRate*t2.Sub(t1).Seconds() + tokenEstimate
			for _, k := range calls {
				gaveBack := !k.settled.IsZero() && k.granted.Before(t1) && !k.settled.Before(t1) && !k.settled.After(t2)
				chargedAfter := !k.granted.Before(t1) && !k.granted.After(t2) && (k.settled.IsZero() || k.settled.After(t2))
				switch {
				case gaveBack:
					allowed += float64(max(k.estimate-k.actual, 0))
				case chargedAfter:
					allowed += float64(max(k.actual-k.estimate, 0))
				}
			}
			if excess := float64(used) - allowed; excess > worst {
				worst = excess
			}
			if float64(used) > allowed {
				t.Errorf("calls %d..%d used %d tokens in %v, more than the bound's %.0f", i, j, used, t2.Sub(t1), allowed)
				return
			}
		}
	}
	t.Logf("the busiest span used %.0f tokens fewer than the bound allows", -worst)
}
