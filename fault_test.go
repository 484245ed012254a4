package pace

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// The fault tests run a fleet of 4 processes of 8 goroutines on one key at
// 200/s burst 10 against a real redis-server, do something to Redis 1.5 s
// in (after every process has sent two heartbeats), undo it 1.5 s later, and
// hold the fleet to the failure policy's promises.
const (
	faultProcs       = 4
	faultLimit       = "200/s burst 10"
	faultRate        = 200.0
	faultCallTimeout = 50 * time.Millisecond
	faultMaxCooldown = 500 * time.Millisecond
	faultAt, healAt  = 1500 * time.Millisecond, 3 * time.Second
	faultRunFor      = 4500 * time.Millisecond
	// schedulingSlack is what a request may take beyond its call timeout and
	// pacing delay: 36 goroutines in 5 processes under the race detector on
	// 2 cores do not run the moment they could.
	schedulingSlack = 50 * time.Millisecond
)

// faultWorker is the fleet of a fault test, against addr.
func faultWorker(addr string, policy FailurePolicy) fleetWorker {
	start := time.Now().Add(time.Second) // time for the processes to start
	return fleetWorker{
		Addr: addr, Limit: faultLimit, Key: "api.example.com:443", Goroutines: 8,
		Start: start, End: start.Add(faultRunFor), Work: 5 * time.Millisecond,
		Policy: policy, CallTimeout: faultCallTimeout, MinCooldown: 50 * time.Millisecond, MaxCooldown: faultMaxCooldown,
	}
}

// outage is what a fault test measured of one fleet run.
type outage struct {
	broke, healed time.Time // when the fault was done and undone
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
			if extra > faultCallTimeout*5/4+schedulingSlack {
				t.Errorf("process %d: a request took %v, %v beyond its pacing delay of %v (limiter %q, error %q)",
					i, q.End.Sub(q.Start), extra, q.Delay, q.Limiter, q.Err)
			}
		}
	}
	t.Logf("longest wait beyond a request's own pacing delay: %v", worst)
}

// checkRecovery: every process went back to Redis within the longest
// cool-down plus one probe after Redis was back, and was granted by Redis
// afterwards.
func checkRecovery(t *testing.T, reports []fleetReport, o outage) {
	t.Helper()
	bound := faultMaxCooldown + faultCallTimeout*5/4 + schedulingSlack
	for i, r := range reports {
		fell := slices.IndexFunc(r.Fallbacks, func(at time.Time) bool { return at.After(o.broke) })
		if fell < 0 || r.Fallbacks[0].Before(o.broke) {
			t.Errorf("process %d fell back at %v, want once, after the fault at %v", i, r.Fallbacks, o.broke)
			continue
		}
		back := slices.IndexFunc(r.Recovers, func(at time.Time) bool { return at.After(o.healed) })
		if back < 0 {
			t.Errorf("process %d did not recover after Redis was back (recoveries %v)", i, r.Recovers)
			continue
		}
		after := r.Recovers[back].Sub(o.healed)
		t.Logf("process %d: fell back %v after the fault, recovered %v after Redis was back", i, r.Fallbacks[fell].Sub(o.broke), after)
		if after > bound {
			t.Errorf("process %d recovered %v after Redis was back, want within %v (the longest cool-down plus one probe)", i, after, bound)
		}
		if len(r.grants("redis")) == 0 || r.grants("redis")[len(r.grants("redis"))-1].Before(r.Recovers[back]) {
			t.Errorf("process %d: no grant by Redis after its recovery", i)
		}
	}
}

// checkFallbackRate: the local grants of all processes together during the
// outage came at the limit's rate, within 10%: each process paced at its
// share, from the fleet size its heartbeats counted.
func checkFallbackRate(t *testing.T, reports []fleetReport, o outage) {
	t.Helper()
	var local []time.Time
	for _, r := range reports {
		for _, at := range r.grants("local") {
			if at.After(o.broke) && at.Before(o.healed) {
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

// runFault runs a fleet with the fallback policy against addr while break
// and heal are done to Redis, and checks every promise of the fallback.
func runFault(t *testing.T, addr string, worker fleetWorker, breakIt, healIt func()) {
	reports, done := runFleet(t, faultProcs, worker, fault{faultAt, breakIt}, fault{healAt, healIt})
	o := outage{broke: done[0], healed: done[1]}
	checkNoErrors(t, reports)
	checkWaits(t, reports)
	checkFallbackRate(t, reports, o)
	checkRecovery(t, reports, o)
}

// TestFaultKill: Redis killed with SIGKILL in a saturated run, then started
// again, empty.
func TestFaultKill(t *testing.T) {
	srv := redistest.Start(t)
	warmScript(t, srv)
	runFault(t, srv.Addr, faultWorker(srv.Addr, FallbackLocal), srv.Kill, srv.Restart)
}

// TestFaultFreeze: Redis frozen with SIGSTOP (alive, silent), then thawed,
// with clients on go-redis's default options, which ignore context deadlines.
func TestFaultFreeze(t *testing.T) {
	srv := redistest.Start(t)
	warmScript(t, srv)
	w := faultWorker(srv.Addr, FallbackLocal)
	w.DefaultClient = true
	runFault(t, srv.Addr, w, srv.Freeze, srv.Thaw)
}

// TestFaultSlowNetwork: 200 ms of latency each way between the fleet and
// Redis, from a proxy, then none again.
func TestFaultSlowNetwork(t *testing.T) {
	srv := redistest.Start(t)
	warmScript(t, srv)
	proxy := redistest.StartProxy(t, srv.Addr)
	runFault(t, proxy.Addr, faultWorker(proxy.Addr, FallbackLocal),
		func() { proxy.SetLatency(200 * time.Millisecond) }, func() { proxy.SetLatency(0) })
}

// warmScript loads the reserve script into srv, as a running fleet would
// have, so that the run starts with EVALSHA.
func warmScript(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if err := mustRedis(t, srv.Client(t), PerSecond(1), WithFleetSize(1)).Wait(context.Background(), "warm-up", 1); err != nil {
		t.Fatal(err)
	}
}

// TestFaultPolicies: under the same fault, a FailOpen fleet lets requests
// through unpaced and a FailClosed one fails them with ErrUnavailable; each
// answers within the call timeout and comes back to Redis by itself.
func TestFaultPolicies(t *testing.T) {
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			warmScript(t, srv)
			reports, done := runFleet(t, faultProcs, faultWorker(srv.Addr, policy),
				fault{faultAt, srv.Kill}, fault{healAt, srv.Restart})
			o := outage{broke: done[0], healed: done[1]}
			checkWaits(t, reports)
			checkRecovery(t, reports, o)
			var open, failed, other int
			var outsideOutage []string
			for _, r := range reports {
				for _, q := range r.Requests {
					switch {
					case q.Err == "" && q.Limiter == "open":
						open++
					case q.Err != "" && q.Unavailable:
						failed++
					case q.Err != "":
						other++
						outsideOutage = append(outsideOutage, q.Err)
					}
					if (q.Limiter == "open" || q.Unavailable) && (q.End.Before(o.broke) || q.Start.After(o.healed.Add(faultMaxCooldown*2))) {
						outsideOutage = append(outsideOutage, "a request decided without Redis outside the outage")
					}
				}
			}
			outage := o.healed.Sub(o.broke).Seconds()
			t.Logf("%v: %d requests let through unpaced, %d failed with ErrUnavailable, in an outage of %.2fs", policy, open, failed, outage)
			if len(outsideOutage) > 0 {
				t.Errorf("%d unexpected outcomes, such as %q", len(outsideOutage), outsideOutage[0])
			}
			switch policy {
			case FailOpen:
				if failed > 0 || float64(open) < 2*faultRate*outage {
					t.Errorf("FailOpen: %d failed, %d let through; want none failed and more than twice the limit let through", failed, open)
				}
			case FailClosed:
				if open > 0 || float64(failed) < faultRate*outage {
					t.Errorf("FailClosed: %d let through, %d failed; want none let through and every request of the outage failed", open, failed)
				}
			}
		})
	}
}
