// Command llm runs a batch of prompts against an LLM API's quota of
// requests and tokens a minute, through pace, from several processes at
// once. Each prompt reserves its estimate (its prompt and its max_tokens, as
// the API charges when it arrives) and is settled with the usage the answer
// reports, whole or at the end of its stream, so the fleet spends the tokens
// the answers really use. With no flags it starts everything on loopback: an
// embedded Redis-protocol store, an API that imitates an OpenAI-compatible
// one and enforces its quota strictly (429 beyond it), and 4 copies of itself
// as worker processes.
//
//	go run ./examples/llm                 # 4 processes x 2 workers, 300 requests and 30,000 tokens a minute
//	go run ./examples/llm -settle=false   # the same, reserving max_tokens and never settling
//	go run ./examples/llm -redis redis://127.0.0.1:6379/0 -json
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetpace/pace/internal/exampleproc"
)

// config is what the example runs, from its flags; workers get it too.
type config struct {
	Redis    string        // a Redis URL, or "" for the embedded store
	Procs    int           // worker processes
	Workers  int           // workers in each
	Requests string        // requests a minute, as pace.ParseLimit reads it
	Tokens   string        // tokens a minute, likewise
	Duration time.Duration // how long the batch sends
	Settle   bool          // settle each reservation at the answer's usage
	Counters bool          // steer the fleet by the API's x-ratelimit headers
	JSON     bool          // one JSON object on stdout instead of the table
}

func main() {
	exampleproc.Worker(workerEnv, job.run)
	var c config
	flag.StringVar(&c.Redis, "redis", "", "Redis URL (default: an embedded store on loopback)")
	flag.IntVar(&c.Procs, "procs", 4, "worker processes")
	flag.IntVar(&c.Workers, "workers", 2, "workers in each process")
	flag.StringVar(&c.Requests, "requests", "300/m", "the API's requests quota, as pace.ParseLimit reads it")
	flag.StringVar(&c.Tokens, "tokens", "30000/m", "the API's tokens quota, as pace.ParseLimit reads it")
	flag.DurationVar(&c.Duration, "duration", 5*time.Second, "how long the batch sends")
	flag.BoolVar(&c.Settle, "settle", true, "settle each reservation at the tokens the answer used (false: keep max_tokens)")
	flag.BoolVar(&c.Counters, "counters", true, "steer the fleet by the API's x-ratelimit headers (false: pace.Transport.IgnoreCounters)")
	flag.BoolVar(&c.JSON, "json", false, "print one JSON object instead of the table")
	flag.Parse()
	exampleproc.Main("llm", c.check, func() (summary, error) { return run(c) }, c.JSON, summary.print)
}

// check reports a flag that cannot work, naming it.
func (c config) check() error {
	switch {
	case c.Procs < 1:
		return fmt.Errorf("-procs %d: want 1 or more", c.Procs)
	case c.Workers < 1:
		return fmt.Errorf("-workers %d: want 1 or more", c.Workers)
	case c.Duration <= 0:
		return fmt.Errorf("-duration %v: want a positive duration", c.Duration)
	}
	_, _, err := c.limits()
	return err
}

// run starts the store, the API and the worker processes, waits for them,
// and returns what the batch achieved.
func run(c config) (summary, error) {
	requests, tokens, _ := c.limits()
	start := time.Now().Add(time.Second) // time for the processes to start
	redisURL := c.Redis
	if redisURL == "" {
		store, err := miniredis.Run()
		if err != nil {
			return summary{}, err
		}
		defer store.Close()
		redisURL = "redis://" + store.Addr()
	}
	upstream := newAPI(requests, tokens, start, start.Add(c.Duration))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return summary{}, err
	}
	server := &http.Server{Handler: upstream, ReadHeaderTimeout: 5 * time.Second}
	go server.Serve(ln)
	defer server.Close()

	jobs := make([]job, c.Procs)
	for i := range jobs {
		jobs[i] = job{Config: c, Redis: redisURL, Target: "http://" + ln.Addr().String() + "/v1/chat/completions", Start: start}
	}
	wait, err := exampleproc.Start[job, report](workerEnv, jobs)
	if err != nil {
		return summary{}, err
	}
	reports, err := wait()
	if err != nil {
		return summary{}, err
	}
	return summarize(c, requests, tokens, upstream, reports), nil
}
