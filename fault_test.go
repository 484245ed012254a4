package pace

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"golang.org/x/time/rate"
)

// The fault tests run a fleet of processes of 8 goroutines each, sending to
// one upstream through a pace Transport on a Redis limiter with pace's
// default options, at 200/s burst 10. The upstream enforces that limit
// strictly, with one token of slack, and answers 429 beyond it. 1.5 s in
// (after every process has sent two heartbeats) something is done to a real
// redis-server, and undone some time later; the fleet then runs on until
// every process can have come back and settled, and a second more.
const (
	faultLimit = "200/s burst 10"
	faultRate  = 200.0
	faultBurst = 10
	faultAt    = 1500 * time.Millisecond
	// faultAfter is how long the fleet runs after the fault is undone: the
	// longest cool-down before a probe, the settle time, and a second.
	faultAfter = DefaultMaxCooldown + (DefaultMaxCooldown + 2*DefaultCallTimeout) + time.Second
	// schedulingSlack is what a request may take beyond its call timeout and
	// pacing delay: up to 73 goroutines in 9 processes under the race
	// detector on 2 cores do not run the moment they could.
	schedulingSlack = 50 * time.Millisecond
	// outageExcess is the README's bound: over any span, the fleet's grants
	// exceed burst + rate*span by at most one burst at each of an outage's two
	// switches (to local pacing, and back to Redis).
	outageExcess = 2 * faultBurst
)

// faultRun is one fleet run with a fault, and what it measured.
type faultRun struct {
	procs         int
	length        time.Duration // from the fault to its undoing
	broke, healed time.Time     // when the fault was done and undone
	reports       []fleetReport
	up            *upstream
}

// runFault runs procs processes against addr (a Redis, or a proxy of it)
// and the strict upstream, does breakIt 1.5 s in and healIt length later.
func runFault(t *testing.T, addr string, procs int, length time.Duration, defaultClient bool, breakIt, healIt func()) faultRun {
	t.Helper()
	up := &upstream{bucket: rate.NewLimiter(faultRate, faultBurst+1)}
	api := httptest.NewServer(up)
	defer api.Close()
	start := time.Now().Add(time.Second) // time for the processes to start
	w := fleetWorker{
		Addr: addr, Limit: faultLimit, Goroutines: 8, URL: api.URL, DefaultClient: defaultClient,
		Start: start, End: start.Add(faultAt + length + faultAfter), Work: time.Millisecond,
	}
	reports, done := runFleet(t, procs, w, fault{at: faultAt, act: breakIt}, fault{at: faultAt + length, act: healIt})
	return faultRun{procs: procs, length: length, broke: done[0], healed: done[1], reports: reports, up: up}
}

// check holds a run with the fallback policy to its promises, and logs
// each process's grants before, during and after the outage.
func (f faultRun) check(t *testing.T) {
	t.Helper()
	checkNoErrors(t, f.reports)
	checkWaits(t, f.reports)
	f.checkRecovery(t)
	if f.length >= 2*time.Second {
		f.checkFallbackRate(t)
	}
	f.checkBound(t)
	for i, r := range f.reports {
		var before, during, after, tooMany int
		for _, q := range r.Requests {
			switch {
			case q.Err != "":
			case q.End.Before(f.broke):
				before++
			case q.End.Before(f.healed):
				during++
			default:
				after++
			}
			if q.Status == http.StatusTooManyRequests {
				tooMany++
			}
		}
		t.Logf("process %d: %d grants before the fault, %d during, %d after; %d 429s", i, before, during, after, tooMany)
	}
}

// checkBound holds the fleet's grants, as the upstream saw them stamped, to
// burst + rate*span + outageExcess over every span, and counts its 429s.
func (f faultRun) checkBound(t *testing.T) {
	t.Helper()
	var grants []time.Time
	tooMany := 0
	for _, a := range f.up.arrivals {
		grants = append(grants, a.granted)
		if a.status == http.StatusTooManyRequests {
			tooMany++
		}
	}
	slices.SortFunc(grants, time.Time.Compare)
	excess, at := maxExcess(grants, faultRate, faultBurst)
	t.Logf("%d processes, outage %v: %d requests, %d 429s; the busiest span held %.1f grants beyond burst + rate*span, at %v into the outage",
		f.procs, f.length, len(grants), tooMany, excess, at.Sub(f.broke).Round(time.Millisecond))
	if excess > outageExcess || tooMany > outageExcess {
		t.Errorf("%.1f grants beyond burst + rate*span and %d 429s; the README's bound is %d", excess, tooMany, outageExcess)
	}
}

// maxExcess returns the most by which the grants of any span [t_i, t_j]
// exceed burst + rate*(t_j - t_i), and the span's end. The excess is
// (j + 1 - rate*t_j) + (rate*t_i - i) - burst: one pass keeps the largest
// rate*t_i - i so far.
func maxExcess(grants []time.Time, rate float64, burst int) (float64, time.Time) {
	best, bestStart := math.Inf(-1), math.Inf(-1)
	var at time.Time
	for j, g := range grants {
		tj := g.Sub(grants[0]).Seconds()
		bestStart = max(bestStart, rate*tj-float64(j))
		if e := float64(j+1) - rate*tj + bestStart - float64(burst); e > best {
			best, at = e, g
		}
	}
	return best, at
}

// checkWaits: no request waited longer than the call timeout (at most 1.25
// times the set one) plus its own pacing delay.
func checkWaits(t *testing.T, reports []fleetReport) {
	t.Helper()
	var worst time.Duration
	for i, r := range reports {
		for _, q := range r.Requests {
			extra := q.End.Sub(q.Start) - q.Delay
			worst = max(worst, extra)
			if extra > DefaultCallTimeout*5/4+schedulingSlack {
				t.Errorf("process %d: a request took %v, %v beyond its pacing delay of %v (limiter %q, error %q)",
					i, q.End.Sub(q.Start), extra, q.Delay, q.Limiter, q.Err)
			}
		}
	}
	t.Logf("longest wait beyond a request's own pacing delay: %v", worst)
}

// checkRecovery: every process fell back after the fault, went back to
// Redis within the longest cool-down plus one probe after Redis was back,
// and was granted by Redis afterwards. (A call can exceed its timeout on a
// loaded machine and make a fallback of its own before the fault: it is
// logged, and the bound holds over the whole run all the same.)
func (f faultRun) checkRecovery(t *testing.T) {
	t.Helper()
	bound := DefaultMaxCooldown + DefaultCallTimeout*5/4 + schedulingSlack
	for i, r := range f.reports {
		fell := slices.IndexFunc(r.Fallbacks, func(at time.Time) bool { return at.After(f.broke) })
		if fell < 0 {
			t.Errorf("process %d did not fall back after the fault at %v (fallbacks %v)", i, f.broke, r.Fallbacks)
			continue
		}
		if fell > 0 {
			t.Logf("process %d also fell back before the fault, at %v", i, r.Fallbacks[:fell])
		}
		back := slices.IndexFunc(r.Recovers, func(at time.Time) bool { return at.After(f.healed) })
		if back < 0 {
			t.Errorf("process %d did not recover after Redis was back (recoveries %v)", i, r.Recovers)
			continue
		}
		after := r.Recovers[back].Sub(f.healed)
		t.Logf("process %d: fell back %v after the fault (a fleet of %d), recovered %v after Redis was back", i, r.Fallbacks[fell].Sub(f.broke), r.Sizes[fell], after)
		if after > bound {
			t.Errorf("process %d recovered %v after Redis was back, want within %v (the longest cool-down plus one probe)", i, after, bound)
		}
		if redis := r.grants("redis"); len(redis) == 0 || redis[len(redis)-1].Before(r.Recovers[back]) {
			t.Errorf("process %d: no grant by Redis after its recovery", i)
		}
	}
}

// checkFallbackRate: the local grants of all processes together came at
// the limit's rate, within 10%, once the outage had settled (half a second
// in: a key's local pacing begins after what Redis had booked): each
// process paced at its share, from the fleet size its heartbeats counted.
func (f faultRun) checkFallbackRate(t *testing.T) {
	t.Helper()
	var local []time.Time
	for _, r := range f.reports {
		for _, at := range r.grants("local") {
			if at.After(f.broke.Add(500*time.Millisecond)) && at.Before(f.healed) {
				local = append(local, at)
			}
		}
	}
	slices.SortFunc(local, time.Time.Compare)
	if len(local) < 100 {
		t.Fatalf("only %d local grants during the outage", len(local))
	}
	span := local[len(local)-1].Sub(local[0]).Seconds()
	rate := float64(len(local)-1) / span
	t.Logf("fallback: %d local grants in %.3fs: %.1f/s across the fleet (limit %v/s)", len(local), span, rate, faultRate)
	if rate < 0.9*faultRate || rate > 1.1*faultRate {
		t.Errorf("fallback rate %.1f/s across the fleet, want within 10%% of %v/s", rate, faultRate)
	}
}

func checkNoErrors(t *testing.T, reports []fleetReport) {
	t.Helper()
	for i, r := range reports {
		for _, q := range r.Requests {
			if q.Err != "" {
				t.Errorf("process %d: %s", i, q.Err)
				return
			}
		}
	}
}

// TestFaultKill: Redis killed with SIGKILL for 0.5 s, 2 s and 5 s, then
// started again, empty, under a fleet of 4 processes; and for 2 s under
// fleets of 2 and 8.
func TestFaultKill(t *testing.T) {
	for _, c := range []struct {
		procs  int
		length time.Duration
	}{{4, 500 * time.Millisecond}, {4, 2 * time.Second}, {4, 5 * time.Second}, {2, 2 * time.Second}, {8, 2 * time.Second}} {
		t.Run(fmt.Sprintf("%d processes, %v", c.procs, c.length), func(t *testing.T) {
			srv := redistest.Start(t)
			warmScript(t, srv)
			runFault(t, srv.Addr, c.procs, c.length, false, srv.Kill, srv.Restart).check(t)
		})
	}
}

// TestFaultFreeze: Redis frozen with SIGSTOP (alive, silent) for 2 s, then
// thawed, with clients on go-redis's default options, which ignore context
// deadlines.
func TestFaultFreeze(t *testing.T) {
	srv := redistest.Start(t)
	warmScript(t, srv)
	runFault(t, srv.Addr, 4, 2*time.Second, true, srv.Freeze, srv.Thaw).check(t)
}

// TestFaultSlowNetwork: 200 ms of latency each way between the fleet and
// Redis, from a proxy, for 2 s, then none again.
func TestFaultSlowNetwork(t *testing.T) {
	srv := redistest.Start(t)
	warmScript(t, srv)
	proxy := redistest.StartProxy(t, srv.Addr)
	runFault(t, proxy.Addr, 4, 2*time.Second, false,
		func() { proxy.SetLatency(200 * time.Millisecond) }, func() { proxy.SetLatency(0) }).check(t)
}

// warmScript loads the scripts into srv, as a running fleet would have, so
// that the run starts with EVALSHA.
func warmScript(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if err := mustRedis(t, srv.Client(t), PerSecond(1), WithFleetSize(1)).Wait(context.Background(), "warm-up", 1); err != nil {
		t.Fatal(err)
	}
}

// TestFaultPolicies: under a kill of 1.5 s, a FailOpen fleet lets requests
// through unpaced and a FailClosed one fails them with ErrUnavailable; each
// answers within the call timeout and comes back to Redis by itself.
func TestFaultPolicies(t *testing.T) {
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			warmScript(t, srv)
			start := time.Now().Add(time.Second)
			const length = 1500 * time.Millisecond
			w := fleetWorker{
				Addr: srv.Addr, Limit: faultLimit, Key: "api.example.com:443", Goroutines: 8, Policy: policy, Work: 5 * time.Millisecond,
				Start: start, End: start.Add(faultAt + length + DefaultMaxCooldown + time.Second),
			}
			reports, done := runFleet(t, 4, w, fault{at: faultAt, act: srv.Kill}, fault{at: faultAt + length, act: srv.Restart})
			f := faultRun{procs: 4, length: length, broke: done[0], healed: done[1], reports: reports}
			checkWaits(t, reports)
			f.checkRecovery(t)
			var open, failed int
			var unexpected []string
			for _, r := range reports {
				for _, q := range r.Requests {
					switch {
					case q.Err == "" && q.Limiter == "open":
						open++
					case q.Err != "" && q.Unavailable:
						failed++
					case q.Err != "":
						unexpected = append(unexpected, q.Err)
					}
					if (q.Limiter == "open" || q.Unavailable) && (q.End.Before(f.broke) || q.Start.After(f.healed.Add(DefaultMaxCooldown*2))) {
						unexpected = append(unexpected, "a request decided without Redis outside the outage")
					}
				}
			}
			seconds := f.healed.Sub(f.broke).Seconds()
			t.Logf("%v: %d requests let through unpaced, %d failed with ErrUnavailable, in an outage of %.2fs", policy, open, failed, seconds)
			if len(unexpected) > 0 {
				t.Errorf("%d unexpected outcomes, such as %q", len(unexpected), unexpected[0])
			}
			switch policy {
			case FailOpen:
				if failed > 0 || float64(open) < 2*faultRate*seconds {
					t.Errorf("FailOpen: %d failed, %d let through; want none failed and more than twice the limit let through", failed, open)
				}
			case FailClosed:
				if open > 0 || float64(failed) < faultRate*seconds {
					t.Errorf("FailClosed: %d let through, %d failed; want none let through and every request of the outage failed", open, failed)
				}
			}
		})
	}
}
