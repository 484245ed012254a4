package main

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/examplestore"
	"github.com/fleetpace/pace/internal/store"
)

// workerEnv, when set, makes the program a worker process, configured by
// the JSON job in the variable.
const workerEnv = "PACE_FLEET_DEMO_WORKER"

// job is what the demo tells one worker process.
type job struct {
	Config config
	Index  int    // this process, from 0
	Redis  string // the Redis URL to use
	Target string // the upstream URL
	Start  time.Time
}

// request is what became of one request of a worker.
type request struct {
	Granted time.Time     // when pace let it go
	Wait    time.Duration // how long pace made it wait, or, in a dry run, would have
	// Booked is how long from its start its limiter's last booking said
	// it would wait: the wait as the limiter's clock has it, which a
	// loaded machine's late wake-ups do not lengthen, paced or dry.
	Booked  time.Duration
	Status  int // the upstream's answer, 0 if none
	start   time.Time
	refused bool // in a dry run: its limiter would have refused it
}

// requestKey is the context key of a request, which a dry run's events fill.
type requestKey struct{}

// bookedWaits notes, in the request of ctx, the wait its limiter booked
// (event e), and, in a dry run, the wait or refusal e reports.
func bookedWaits(ctx context.Context, e pace.Event) {
	q, ok := ctx.Value(requestKey{}).(*request)
	switch {
	case !ok:
	case e.Kind == pace.EventWait:
		q.Booked = time.Since(q.start) + e.Delay
		if e.DryRun {
			q.Wait = e.Delay
		}
	case e.Kind == pace.EventRefuse && e.DryRun:
		q.refused = true
	}
}

// report is what a worker process prints on stdout.
type report struct {
	Requests    []request
	Critical    []request // with -priority, from the first process
	ScriptCalls int64     // script round trips to Redis (FCALL, EVALSHA, EVAL)
	SyncCalls   int64     // of them, those that synced the upstream's counters
	Happened    happenings
	// With -metrics: where the process served them, and the decisions they
	// counted, scraped at the end of the run.
	MetricsURL       string
	MetricsDecisions float64
}

// quota is the quota of c's fleet, or, for one of its processes alone
// (-local), its share.
func (c config) quota() (pace.Quota, error) {
	limit, err := pace.ParseLimit(c.Limit)
	if err != nil {
		return nil, err
	}
	inFlight := c.Concurrency
	if c.Local {
		limit = pace.PerSecond(limit.Rate() / float64(c.Procs)).WithBurst(max(limit.Burst()/c.Procs, 1))
		inFlight /= c.Procs
	}
	if inFlight == 0 {
		return limit, nil
	}
	return pace.AllOf(limit, pace.Concurrent(inFlight)), nil
}

// stampGrant is the Base of a worker's Transport: it notes when pace let a
// request go.
type stampGrant struct {
	base    http.RoundTripper
	granted func(time.Time)
}

func (s stampGrant) RoundTrip(req *http.Request) (*http.Response, error) {
	s.granted(time.Now())
	return s.base.RoundTrip(req)
}

func (j job) run() (report, error) {
	c := j.Config
	quota, err := c.quota()
	if err != nil {
		return report{}, err
	}
	var scripts store.ScriptCounter
	var syncs atomic.Int64
	var happened happeningsLog
	var served *metrics // with -metrics
	var limiter pace.Limiter
	options := []pace.Option{pace.WithObserver(bookedWaits)}
	if c.DryRun {
		options = append(options, pace.WithDryRun())
	}
	if c.Local {
		if limiter, err = pace.NewLocal(quota, options...); err != nil {
			return report{}, err
		}
	} else {
		options, err := redis.ParseURL(j.Redis)
		if err != nil {
			return report{}, err
		}
		options.ContextTimeoutEnabled = true
		examplestore.QuietRedis()
		client := redis.NewClient(options)
		defer client.Close()
		client.AddHook(&scripts)
		observe := func(ctx context.Context, e pace.Event) {
			if e.Kind == pace.EventReading || e.Kind == pace.EventStaleReading {
				syncs.Add(1) // one a sync: the limit is one bucket
			}
			bookedWaits(ctx, e)
			happened.observe(ctx, e)
		}
		if c.Metrics != "" {
			if served, err = serveMetrics(c.Metrics, j.Index); err != nil {
				return report{}, err
			}
			defer served.close()
			count := observe
			observe = func(ctx context.Context, e pace.Event) {
				count(ctx, e)
				served.observer(ctx, e)
			}
		}
		redisOptions := []pace.Option{pace.WithObserver(observe)}
		if c.DryRun {
			redisOptions = append(redisOptions, pace.WithDryRun())
		}
		r, err := pace.NewRedis(client, quota, redisOptions...)
		if err != nil {
			return report{}, err
		}
		defer r.Close()
		limiter = r
		// Before the start: open a connection, load the script and send the
		// first heartbeats, so that the run measures pacing, not a cold start.
		slot, err := r.Acquire(context.Background(), "warm-up", 1)
		if err != nil {
			return report{}, err
		}
		slot.Release()
		scripts.Calls.Store(0) // the run's calls, not the warm-up's
	}
	base := &http.Transport{MaxIdleConnsPerHost: c.Workers + 1}
	defer base.CloseIdleConnections()
	send := func(class pace.Class, every time.Duration, into *[]request, mu *sync.Mutex) {
		j.send(limiter, base, class, every, into, mu)
	}

	var mu sync.Mutex
	var rep report
	var wg sync.WaitGroup
	time.Sleep(time.Until(j.Start))
	class := pace.ClassDefault
	if c.Priority {
		class = pace.ClassBatch
		if j.Index == 0 {
			wg.Go(func() { send(pace.ClassCritical, 100*time.Millisecond, &rep.Critical, &mu) })
		}
	}
	for w := range c.Workers {
		if j.Index*c.Workers+w < c.Procs*c.Workers-c.Idle { // else an idle worker
			wg.Go(func() { send(class, 0, &rep.Requests, &mu) })
		}
	}
	wg.Wait()
	rep.ScriptCalls, rep.SyncCalls, rep.Happened = scripts.Calls.Load(), syncs.Load(), happened.happened()
	if served != nil {
		rep.MetricsURL = served.url
		if rep.MetricsDecisions, err = served.decisions(); err != nil {
			return report{}, err
		}
	}
	return rep, nil
}

// send sends requests of class through a Transport on limiter until the
// run's end, one after another (every 0), one every every, or, with
// -arrivals, one every 1/arrivals each on its own, and notes each in into.
func (j job) send(limiter pace.Limiter, base http.RoundTripper, class pace.Class, every time.Duration, into *[]request, mu *sync.Mutex) {
	end := j.Start.Add(j.Config.Duration)
	openLoop := j.Config.Arrivals > 0 && every == 0
	if openLoop {
		every = time.Duration(float64(time.Second) / j.Config.Arrivals)
	}
	var sent sync.WaitGroup
	defer sent.Wait()
	for next := time.Now(); next.Before(end); next = next.Add(every) {
		time.Sleep(time.Until(next))
		if openLoop {
			sent.Go(func() { j.sendOne(limiter, base, class, end, into, mu) })
		} else if !j.sendOne(limiter, base, class, end, into, mu) {
			return
		}
	}
}

// sendOne sends one request of class through a Transport on limiter, with
// the deadline end, and notes it in into; it returns false when the next
// would pass end.
func (j job) sendOne(limiter pace.Limiter, base http.RoundTripper, class pace.Class, end time.Time, into *[]request, mu *sync.Mutex) bool {
	start := time.Now()
	q := &request{start: start}
	client := &http.Client{Transport: &pace.Transport{Limiter: limiter, Base: stampGrant{base, func(at time.Time) {
		q.Granted = at
		if !j.Config.DryRun {
			q.Wait = at.Sub(start)
		}
	}}}}
	ctx, cancel := context.WithDeadline(pace.WithClass(context.WithValue(context.Background(), requestKey{}, q), class), end)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, j.Target, nil)
	resp, err := client.Do(req)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return false // the grant would come after the end
	case err != nil:
		time.Sleep(100 * time.Millisecond) // the upstream failed: not a busy loop
		return true
	}
	resp.Body.Close()
	q.Status = resp.StatusCode
	if !q.refused { // a dry run's refusal is as an enforcing run's: not a request sent
		mu.Lock()
		*into = append(*into, *q)
		mu.Unlock()
	}
	return true
}
