package pace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/quotaapi"
	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

// fleetWorkerEnv, when set, makes the test binary a fleet worker: a process
// of its own, configured by the JSON fleetWorker in the variable.
const fleetWorkerEnv = "PACE_FLEET_WORKER"

// fleetWorker is what a worker process is told to do: run Goroutines
// goroutines that wait on one Redis limiter for Key, one request after
// another, from Start until End.
type fleetWorker struct {
	Addr       string   // Redis
	Limit      string   // in ParseLimit syntax
	AlsoLimits []string // more limits of the same quota (AllOf)
	Key        string
	Goroutines int
	Start, End time.Time // the same for every process of the fleet

	Policy                   FailurePolicy
	CallTimeout              time.Duration // 0: the default
	MinCooldown, MaxCooldown time.Duration // 0: the defaults
	// DefaultClient leaves go-redis's options as they are, so that pace
	// must guard each call; otherwise the client applies context deadlines.
	DefaultClient bool
	// Work is how long each request takes after its grant (the upstream's
	// time), so that a limiter that does not pace cannot spin the worker.
	Work time.Duration
	// StopAtEnd gives each wait the deadline End, and ends a goroutine
	// whose wait would pass it, so that no grant falls after End.
	StopAtEnd bool
	// URL, when set, is an upstream to GET through a Transport on the
	// limiter, instead of calling Wait; each request carries the time of its
	// grant in grantedAtHeader.
	URL string
	// Tokens, when set, makes each request an LLM call on a quota of
	// requests and tokens, reserved and settled (see tokenRun); Limit is
	// not used.
	Tokens *tokenRun
	// Lease is the lease of slots (WithLease); 0 for the default.
	Lease time.Duration
	// ShopifyCost, when set with URL, makes each request cost that much
	// under the limit, and the Transport read the counters of the
	// upstream's bodies (ShopifyCounters); each body is read to its end.
	ShopifyCost int
	// Pool, when set with URL, names the credentials of the Transport's
	// Pool: each secret is poolSecret of its name, in Authorization.
	Pool []string
	// WarmUp, with URL, opens a connection to it for each goroutine before
	// Start, by a HEAD request that carries quotaapi.WarmUpHeader (which
	// the upstream must not count), so that the run measures pacing, not
	// connections being opened.
	WarmUp bool
	// CountFirst waits on a key of its own before Start until a heartbeat
	// has counted the fleet, so that the run starts with the process knowing
	// its share (processes started together count one another at their
	// second heartbeat, a tenth of a second after their first).
	CountFirst bool
}

// tokenRun makes each request of a worker an LLM call under the quota
// AllOf(Requests named "requests", Tokens named "tokens"): a reservation of
// Estimate tokens, a response that takes Response, and, when Settle, a
// settlement at an actual count drawn uniformly from ActualMin to ActualMax.
type tokenRun struct {
	Requests, Tokens               string // in ParseLimit syntax
	Estimate, ActualMin, ActualMax int
	Response                       time.Duration
	Settle                         bool
}

// quota is the quota of a token run.
func (tr tokenRun) quota() (Quota, error) {
	requests, err := ParseLimit(tr.Requests)
	if err != nil {
		return nil, err
	}
	tokens, err := ParseLimit(tr.Tokens)
	return AllOf(requests.Named("requests"), tokens.Named("tokens")), err
}

// wait is one LLM call for key on r: its reservation, its response, its
// settlement; it notes them in the request of ctx.
func (tr tokenRun) wait(ctx context.Context, r *Redis, key string) error {
	res, err := r.Reserve(ctx, key, Costs{"tokens": tr.Estimate})
	if err != nil {
		return err
	}
	q := ctx.Value(requestKey{}).(*fleetRequest)
	q.End, q.Estimate = time.Now(), tr.Estimate
	q.Actual = tr.ActualMin + mathrand.IntN(tr.ActualMax-tr.ActualMin+1)
	time.Sleep(tr.Response)
	if !tr.Settle {
		return nil
	}
	err = r.Settle(ctx, res, Costs{"tokens": q.Actual})
	q.Settled = time.Now()
	return err
}

// grantedAtHeader carries, in a fleet's requests to an upstream, the
// UnixNano time the limiter granted them; heardHoldHeader, whether their
// process had heard of a hold by then.
const (
	grantedAtHeader = "X-Granted-At"
	heardHoldHeader = "X-Heard-Hold"
)

// upstream is an API on loopback for the fleets. It notes every arrival.
// With a bucket, it enforces a limit strictly and answers 429 beyond it. At
// its first arrival after speakAt (when set), it answers once with status
// and a header that asks the fleet to hold off. Every other request gets a
// 200.
type upstream struct {
	bucket        *rate.Limiter
	speakAt       time.Time
	status        int
	header, value string
	mu            sync.Mutex
	arrivals      []arrival
	spoke         time.Time // when it answered with the hold
}

type arrival struct {
	at, granted time.Time
	heardHold   bool // its process had heard of a hold when it was granted
	status      int
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	granted, _ := strconv.ParseInt(r.Header.Get(grantedAtHeader), 10, 64)
	u.mu.Lock()
	defer u.mu.Unlock()
	status := http.StatusOK
	if !u.speakAt.IsZero() && u.spoke.IsZero() && now.After(u.speakAt) {
		u.spoke, status = now, u.status
		w.Header().Set(u.header, u.value)
	} else if u.bucket != nil && !u.bucket.AllowN(now, 1) {
		status = http.StatusTooManyRequests
	}
	u.arrivals = append(u.arrivals, arrival{now, time.Unix(0, granted), r.Header.Get(heardHoldHeader) != "", status})
	w.WriteHeader(status)
}

// stampGrant is the Base of a fleet worker's Transport: it sends a copy of
// the request that says when it was granted, and whether its limiter had
// heard of a hold by then.
type stampGrant struct {
	base    http.RoundTripper
	limiter *Redis
}

func (s stampGrant) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	if q, ok := req.Context().Value(requestKey{}).(*fleetRequest); ok {
		q.Granted = now
	}
	req = req.Clone(req.Context())
	req.Header.Set(grantedAtHeader, strconv.FormatInt(now.UnixNano(), 10))
	if s.limiter.held.n.Load() > 0 {
		req.Header.Set(heardHoldHeader, "1")
	}
	return s.base.RoundTrip(req)
}

// warmUp opens n connections of base to url at once, by HEAD requests that
// carry quotaapi.WarmUpHeader, and leaves them idle.
func warmUp(base http.RoundTripper, url string, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodHead, url, nil)
			req.Header.Set(quotaapi.WarmUpHeader, "1")
			if resp, err := base.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// fleetRequest is what became of one Wait in a worker.
type fleetRequest struct {
	Start, End  time.Time
	Granted     time.Time     // when a Transport's request left pace for the upstream
	Limiter     string        // who granted it, from its EventWait; "" if it failed
	Delay       time.Duration // the pacing delay it was given: from its first booking to the end of its last
	Status      int           // the upstream's answer, when the fleet has one
	Booked      time.Time     // when it was first booked
	CallTimeout time.Duration // the longer of its limiter's call timeouts at its start and end
	Err         string
	Unavailable bool // Err wraps ErrUnavailable
	// Of an LLM call (tokenRun): its estimated and actual tokens, and
	// when it was settled (zero if never).
	Estimate, Actual int
	Settled          time.Time
}

// fleetReport is what a worker process prints on stdout.
type fleetReport struct {
	Requests  []fleetRequest
	Fallbacks []time.Time // EventFallback
	Sizes     []int       // the fleet's size as the process counted it, at each fallback
	Recovers  []time.Time // EventRecover
	Holds     []time.Time // EventHold
	Cancels   int
	// Stall is the most that a short sleep of the process overran while
	// it ran: how long the machine left it without a core at once.
	Stall time.Duration
	Err   string
}

// grants returns the end times of the granted requests, sorted.
func (r fleetReport) grants(limiter string) []time.Time {
	var grants []time.Time
	for _, q := range r.Requests {
		if q.Err == "" && (limiter == "" || q.Limiter == limiter) {
			grants = append(grants, q.End)
		}
	}
	slices.SortFunc(grants, time.Time.Compare)
	return grants
}

// runFleetWorker runs one fleet worker process and returns its exit code.
func runFleetWorker() int {
	var w fleetWorker
	var report fleetReport
	err := json.Unmarshal([]byte(os.Getenv(fleetWorkerEnv)), &w)
	if err == nil {
		report, err = w.run()
	}
	if err == nil { // the limiter and client are done with: nothing of theirs may still run
		err = goleak.Find()
	}
	if err != nil {
		report.Err = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(report)
	if err != nil {
		return 1
	}
	return 0
}

type requestKey struct{}

// quota is the quota w's limiter enforces.
func (w fleetWorker) quota() (Quota, error) {
	if w.Tokens != nil {
		return w.Tokens.quota()
	}
	limit, err := ParseLimit(w.Limit)
	all := []Limit{limit}
	for _, text := range w.AlsoLimits {
		l, lerr := ParseLimit(text)
		err = errors.Join(err, lerr)
		all = append(all, l)
	}
	if len(all) == 1 {
		return limit, err
	}
	return AllOf(all...), err
}

func (w fleetWorker) run() (fleetReport, error) {
	quota, err := w.quota()
	if err != nil {
		return fleetReport{}, err
	}
	options := &redis.Options{Addr: w.Addr}
	if !w.DefaultClient {
		options.ContextTimeoutEnabled = true
		options.PoolSize = 64 // see docs/failures.md: dial failures beyond PoolSize slow recovery
	}
	client := redis.NewClient(options)
	defer client.Close()

	var mu sync.Mutex
	var report fleetReport
	var r *Redis // set before any event
	opts := []Option{WithFailurePolicy(w.Policy), WithObserver(func(ctx context.Context, e Event) {
		mu.Lock()
		defer mu.Unlock()
		switch e.Kind {
		case EventWait:
			if q, ok := ctx.Value(requestKey{}).(*fleetRequest); ok {
				// After its first booking, a request sleeps in the bookings
				// that cuts of the key's rate void, and books anew.
				now := time.Now()
				if q.Booked.IsZero() {
					q.Booked = now
				}
				q.Limiter, q.Delay = e.Limiter, now.Sub(q.Booked)+e.Delay
			}
		case EventCancel:
			report.Cancels++
		case EventFallback:
			report.Fallbacks = append(report.Fallbacks, time.Now())
			report.Sizes = append(report.Sizes, r.fleet.Size())
		case EventRecover:
			report.Recovers = append(report.Recovers, time.Now())
		case EventHold:
			report.Holds = append(report.Holds, time.Now())
		}
	})}
	if w.CallTimeout > 0 {
		opts = append(opts, WithCallTimeout(w.CallTimeout))
	}
	if w.MaxCooldown > 0 {
		opts = append(opts, WithCooldown(w.MinCooldown, w.MaxCooldown))
	}
	if w.Lease > 0 {
		opts = append(opts, WithLease(w.Lease))
	}
	r, err = NewRedis(client, quota, opts...)
	if err != nil {
		return fleetReport{}, err
	}
	defer r.Close()

	// Open a connection for each goroutine, then line up with the other
	// processes: the run measures pacing, not a cold start.
	var warm sync.WaitGroup
	for range w.Goroutines {
		warm.Go(func() { client.Ping(context.Background()) })
	}
	warm.Wait()
	wait := func(ctx context.Context) error { return r.Wait(ctx, w.Key, 1) }
	if w.Tokens != nil {
		wait = func(ctx context.Context) error { return w.Tokens.wait(ctx, r, w.Key) }
	}
	if w.URL != "" {
		base := &http.Transport{MaxIdleConnsPerHost: w.Goroutines}
		defer base.CloseIdleConnections()
		transport := &Transport{Base: stampGrant{base, r}, Limiter: r}
		if w.ShopifyCost > 0 {
			transport.BodyCounters = ShopifyCounters
			transport.Cost = func(*http.Request) int { return w.ShopifyCost }
		}
		if w.Pool != nil {
			transport.Pool = &Pool{}
			for _, name := range w.Pool {
				transport.Pool.Credentials = append(transport.Pool.Credentials, Credential{Name: name, Secret: poolSecret(name)})
			}
		}
		client := &http.Client{Transport: transport}
		if w.WarmUp {
			warmUp(base, w.URL, w.Goroutines)
		}
		wait = func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ctx.Value(requestKey{}).(*fleetRequest).Status = resp.StatusCode
			}
			return err
		}
	}
	if w.CountFirst {
		for r.fleet.size.Load() == 0 && time.Until(w.Start) > heartbeatEvery/10 {
			r.Wait(context.Background(), "count the fleet", 1)
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(time.Until(w.Start))
	var wg sync.WaitGroup
	wg.Go(func() { report.Stall = longestStall(w.End) })
	for range w.Goroutines {
		wg.Go(func() {
			for time.Now().Before(w.End) {
				q := &fleetRequest{Start: time.Now(), CallTimeout: r.calls.Timeout()}
				ctx, cancel := context.WithValue(context.Background(), requestKey{}, q), context.CancelFunc(func() {})
				if w.StopAtEnd {
					ctx, cancel = context.WithDeadline(ctx, w.End)
				}
				err := wait(ctx)
				cancel()
				if w.StopAtEnd && errors.Is(err, context.DeadlineExceeded) {
					return
				}
				mu.Lock()
				if q.End.IsZero() {
					q.End = time.Now()
				}
				q.CallTimeout = max(q.CallTimeout, r.calls.Timeout())
				if err != nil {
					q.Err, q.Unavailable = err.Error(), errors.Is(err, ErrUnavailable)
				}
				report.Requests = append(report.Requests, *q)
				mu.Unlock()
				time.Sleep(w.Work)
			}
		})
	}
	wg.Wait()
	return report, nil
}

// longestStall sleeps 5 ms at a time until end and returns the most that a
// sleep overran.
func longestStall(end time.Time) time.Duration {
	const nap = 5 * time.Millisecond
	var longest time.Duration
	for time.Now().Before(end) {
		before := time.Now()
		time.Sleep(nap)
		longest = max(longest, time.Since(before)-nap)
	}
	return longest
}

// besideOthers lets a test run beside the other tests that call it (as
// many at once as go test's -parallel allows) once the package's other
// tests are done: each runs a fleet that sleeps most of its time, against
// a Redis of its own, and uses a quarter of a core at most under the race
// detector. The fault fleets, which use more, run in pairs (internal/pairs);
// the loaded machine, whose bounds measure the machine's load, alone.
func besideOthers(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// runFleet starts procs worker processes of this test binary, all told to do
// w, and returns their reports. During the run, it calls each fault's act at
// its time after w.Start, and returns when each was done too.
func runFleet(t *testing.T, procs int, w fleetWorker, faults ...fault) ([]fleetReport, []time.Time) {
	t.Helper()
	config, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Until(w.End)+30*time.Second)
	defer cancel()
	reports := make([]fleetReport, procs)
	errs := make([]error, procs)
	cmds := make([]*exec.Cmd, procs)
	killed := make([]bool, procs)
	var wg sync.WaitGroup
	for i := range procs {
		cmds[i] = exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmds[i].Env = append(os.Environ(), fleetWorkerEnv+"="+string(config))
		var stdout, stderr bytes.Buffer
		cmds[i].Stdout, cmds[i].Stderr = &stdout, &stderr
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			runErr := cmds[i].Wait()
			if err := json.Unmarshal(stdout.Bytes(), &reports[i]); err != nil || runErr != nil || reports[i].Err != "" {
				errs[i] = fmt.Errorf("worker %d: %v %s; stderr: %s", i, runErr, reports[i].Err, stderr.String())
			}
		})
	}
	done := make([]time.Time, len(faults))
	for i, f := range faults {
		time.Sleep(time.Until(w.Start.Add(f.at)))
		if f.kill {
			victim := readyWorker(cmds, f.ready)
			killed[victim] = true
			cmds[victim].Process.Kill()
		}
		if f.act != nil {
			f.act()
		}
		done[i] = time.Now()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !killed[i] {
			t.Fatal(err)
		}
	}
	return reports, done
}

// A fault is something done during a fleet run, at a time after its start:
// kill, when set, SIGKILLs the first worker whose pid ready says is ready
// (see readyWorker), whose report is then empty; act, when set, runs next.
type fault struct {
	at    time.Duration
	act   func()
	kill  bool
	ready func(pid int) bool
}

// readyWorker returns the index of the first of the workers that ready
// says is ready, asking of each in turn for a second at most, or 0 if none
// is by then. Asking one worker alone was not enough: a worker may
// rightly be in no state ready looks for during a whole second (a process
// whose 16 requests line up together for a cap of 10 holds no slot for
// about 1.5 s of every 2.6).
func readyWorker(cmds []*exec.Cmd, ready func(pid int) bool) int {
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for i, c := range cmds {
			if ready(c.Process.Pid) {
				return i
			}
		}
	}
	return 0
}

// TestRedisFleet: 4 processes of 8 goroutines each share one key at 200/s
// burst 10 for 3 s through one real Redis. Together they get at most
// 10 + 200*t + 1 grants over the span t they cover and at least 97% of
// 200*t, with exactly one script call per grant.
func TestRedisFleet(t *testing.T) {
	besideOthers(t)
	ctx := context.Background()
	c := newTestRedis(t)
	const limit = "200/s burst 10"
	warm := mustRedis(t, c, mustParseLimit(t, limit), WithFleetSize(1))
	if err := warm.Wait(ctx, "warm-up", 1); err != nil { // loads the script, so workers' EVALSHA finds it
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	start := time.Now().Add(time.Second) // time for the processes to start
	reports, _ := runFleet(t, 4, fleetWorker{
		Addr: c.Options().Addr, Limit: limit, Key: "api.example.com:443",
		Goroutines: 8, Start: start, End: start.Add(3 * time.Second),
	})

	var grants []time.Time
	var cancels int
	for i, r := range reports {
		if n := len(r.grants("redis")); n != len(r.Requests) || n < 50 {
			t.Errorf("process %d: %d of %d requests granted by Redis, want all, and at least 50", i, n, len(r.Requests))
		}
		grants = append(grants, r.grants("")...)
		cancels += r.Cancels
	}
	slices.SortFunc(grants, time.Time.Compare)
	checkGrants(t, start, grants, 200, 10)

	calls, err := redistest.CommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	scriptCalls := redistest.ScriptCalls(calls)
	t.Logf("%d script calls (fcall %d, evalsha %d, eval %d) for %d grants: %.2f per grant; %d refunds; %d heartbeats",
		scriptCalls, calls["fcall"].Calls, calls["evalsha"].Calls, calls["eval"].Calls, len(grants), float64(scriptCalls)/float64(len(grants)), cancels, calls["zadd"].Calls)
	if scriptCalls != int64(len(grants)) || cancels != 0 {
		t.Errorf("%d script calls and %d refunds for %d grants, want exactly one reservation call per grant and no refund",
			scriptCalls, cancels, len(grants))
	}
}

func mustParseLimit(t testing.TB, s string) Limit {
	t.Helper()
	l, err := ParseLimit(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
