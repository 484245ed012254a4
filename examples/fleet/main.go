// Command fleet shows a fleet of processes sharing one API quota through
// pace. With no flags it starts everything it needs on loopback: an embedded
// Redis-protocol store, an upstream API that enforces the quota strictly
// (429 beyond it) and states its counters as OpenAI does, and several
// copies of itself as worker processes, each with its own pace Transport.
// After a few seconds it prints what the fleet achieved.
//
//	go run ./examples/fleet                    # 4 processes x 2 workers at 200/s burst 10
//	go run ./examples/fleet -idle 6            # only 2 of the 8 workers busy: the quota is still used
//	go run ./examples/fleet -local -idle 6     # each process alone at 1/4 of the quota: what a static split costs
//	go run ./examples/fleet -foreign 50        # a client without pace takes 50/s: the fleet takes the rest
//	go run ./examples/fleet -retry-after-each 1 -slack 0  # every 429 says Retry-After: 1, as most APIs' do
//	go run ./examples/fleet -foreign 50 -headers github  # the same, over a fixed window with GitHub's headers
//	go run ./examples/fleet -concurrency 4     # at most 4 in flight in the whole fleet, each taking 50 ms upstream
//	go run ./examples/fleet -priority          # critical requests beside the batch workers: they wait one or two intervals
//	go run ./examples/fleet -metrics 127.0.0.1:9464  # each worker serves its metrics on /metrics, on 9464, 9465...
//	go run ./examples/fleet -redis redis://127.0.0.1:6379/0 -json -plot fleet.svg
package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/exampleproc"
	"github.com/fleetpace/pace/internal/quotaapi"
)

// config is what the demo runs, from its flags; workers get it too.
type config struct {
	Redis      string        // a Redis URL, or "" for the embedded store
	Target     string        // an upstream URL, or "" for the built-in one
	Procs      int           // worker processes
	Workers    int           // workers in each
	Limit      string        // in pace.ParseLimit's syntax
	Duration   time.Duration // how long the fleet sends
	Idle       int           // workers (counted from the last) that send nothing
	Local      bool          // each process alone, with pace.Local at its share
	JSON       bool          // one JSON object on stdout instead of the table
	Plot       string        // an SVG file for requests per second over time
	KillRedis  time.Duration // stop the embedded store this far in, for a second
	RetryAfter bool          // the built-in upstream answers one 429 with Retry-After: 1
	RetryEach  int           // the built-in upstream's every 429 says Retry-After: this many seconds (0: none)
	Foreign    float64       // a foreign client's rate on the built-in upstream, without pace
	Headers    string        // the dialect of the built-in upstream's counters
	Slack      int           // tokens the built-in upstream's bucket holds beyond the limit's burst
	// Concurrency caps the requests in flight in the whole fleet (0: no
	// cap); the built-in upstream then takes Service to answer each.
	Concurrency int
	// Priority makes the workers' requests batch requests, and sends
	// critical ones beside them from the first process.
	Priority bool
	// Metrics, when set, is where each worker process serves its
	// OpenTelemetry metrics as Prometheus text (HOST:PORT, on PORT plus the
	// process's index).
	Metrics string
	// Arrivals, when set, makes each worker send this many requests a
	// second, each on its own, whatever the waits of the others (an open
	// loop), instead of one after another.
	Arrivals float64
	// DryRun makes the limiters dry runs (pace.WithDryRun): nothing waits,
	// and each request's wait is the one its limiter reported.
	DryRun bool
}

// service is how long the built-in upstream takes to answer, under
// -concurrency.
const service = 50 * time.Millisecond

func main() {
	exampleproc.Worker(workerEnv, job.run)
	var c config
	flag.StringVar(&c.Redis, "redis", "", "Redis URL (default: an embedded store on loopback)")
	flag.StringVar(&c.Target, "target", "", "upstream URL to send GETs to (default: a built-in API that enforces the limit)")
	flag.IntVar(&c.Procs, "procs", 4, "worker processes")
	flag.IntVar(&c.Workers, "workers", 2, "workers in each process")
	flag.StringVar(&c.Limit, "limit", "200/s burst 10", "the quota, as pace.ParseLimit reads it")
	flag.DurationVar(&c.Duration, "duration", 5*time.Second, "how long the fleet sends")
	flag.IntVar(&c.Idle, "idle", 0, "workers that send nothing (the last ones)")
	flag.BoolVar(&c.Local, "local", false, "no Redis: each process paces alone at its share of the limit")
	flag.BoolVar(&c.JSON, "json", false, "print one JSON object instead of the table")
	flag.StringVar(&c.Plot, "plot", "", "write requests per second over time to this SVG file")
	flag.DurationVar(&c.KillRedis, "kill-redis-at", 0, "stop the embedded store this far into the run, for a second")
	flag.BoolVar(&c.RetryAfter, "retry-after", false, "the built-in upstream answers one 429 with Retry-After: 1, a third into the run")
	flag.IntVar(&c.RetryEach, "retry-after-each", 0, "the built-in upstream's every 429 says Retry-After: this many seconds, as most APIs' do (0: none)")
	flag.Float64Var(&c.Foreign, "foreign", 0, "a foreign client spends this many requests a second of the built-in upstream's quota, without pace")
	flag.IntVar(&c.Concurrency, "concurrency", 0, "at most this many requests in flight in the whole fleet (the built-in upstream then takes 50 ms a request)")
	flag.StringVar(&c.Metrics, "metrics", "", "each worker process serves its metrics (paceotel) as Prometheus text on this HOST:PORT, plus its index (PORT 0: any free port)")
	flag.Float64Var(&c.Arrivals, "arrivals", 0, "each worker sends this many requests a second, each on its own (0: one after another)")
	flag.BoolVar(&c.DryRun, "dry-run", false, "the limiters are dry runs: nothing waits, and the waits they would impose are reported")
	flag.BoolVar(&c.Priority, "priority", false, "the workers send batch requests, and the first process sends 10 critical requests a second beside them")
	flag.IntVar(&c.Slack, "slack", 1, "tokens the built-in upstream's bucket holds beyond the limit's burst (0: exactly the limit)")
	flag.StringVar(&c.Headers, "headers", "openai", "the built-in upstream states its counters as github, ietf, openai-window (a fixed window ten times as long as the run), openai, gateway (a token bucket: its burst, and whole seconds until full, in GitHub's fields), gateway-unix (the same, its reset the Unix time it is full) or \"\" (none) does")
	flag.Parse()
	exampleproc.Main("fleet", c.check, func() (summary, error) { return run(c) }, c.JSON, summary.print)
}

// check reports a flag that cannot work, naming it.
func (c config) check() error {
	switch {
	case c.Procs < 1:
		return fmt.Errorf("-procs %d: want 1 or more", c.Procs)
	case c.Workers < 1:
		return fmt.Errorf("-workers %d: want 1 or more", c.Workers)
	case c.Idle < 0 || c.Idle >= c.Procs*c.Workers:
		return fmt.Errorf("-idle %d: want 0 to %d, fewer than the %d workers", c.Idle, c.Procs*c.Workers-1, c.Procs*c.Workers)
	case c.Duration <= 0:
		return fmt.Errorf("-duration %v: want a positive duration", c.Duration)
	case c.Metrics != "" && c.Local:
		return fmt.Errorf("-metrics works with Redis only (the metrics are a Redis limiter's)")
	case c.KillRedis != 0 && (c.Redis != "" || c.Local):
		return fmt.Errorf("-kill-redis-at works on the embedded store only")
	case (c.RetryAfter || c.RetryEach != 0 || c.Foreign != 0) && c.Target != "":
		return fmt.Errorf("-retry-after, -retry-after-each and -foreign work with the built-in upstream only")
	case c.RetryEach < 0 || c.RetryEach > 3600:
		return fmt.Errorf("-retry-after-each %d: want 0 (none) to 3600 seconds", c.RetryEach)
	case c.Slack < 0 || (c.Slack != 1 && c.Target != ""):
		return fmt.Errorf("-slack %d: want 0 or more, with the built-in upstream only", c.Slack)
	case c.Arrivals < 0 || c.Arrivals > 10000:
		return fmt.Errorf("-arrivals %v: want 0 (one after another) to 10000 a second", c.Arrivals)
	case c.DryRun && (c.Concurrency > 0 || c.Priority):
		return fmt.Errorf("-dry-run keeps no cap in flight and no classes: not with -concurrency or -priority")
	case c.DryRun && c.Arrivals == 0:
		return fmt.Errorf("-dry-run needs -arrivals: a worker that sends one request after another sends faster when nothing waits, and its dry run would report waits that grow without end")
	case c.Concurrency < 0 || (c.Local && c.Concurrency > 0 && c.Concurrency < c.Procs):
		return fmt.Errorf("-concurrency %d: want 0 (none) or more, and with -local at least one a process", c.Concurrency)
	}
	limit, err := pace.ParseLimit(c.Limit)
	if err != nil {
		return err
	}
	if !(c.Foreign >= 0 && c.Foreign < limit.Rate()) {
		return fmt.Errorf("-foreign %v: want 0 or more, and less than the limit's %v/s", c.Foreign, limit.Rate())
	}
	if _, err := quotaapi.ParseDialect(c.Headers); err != nil {
		return fmt.Errorf("-headers: %w", err)
	}
	return nil
}
