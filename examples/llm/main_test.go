package main

import (
	"strings"
	"sync"
	"testing"

	"github.com/fleetpace/pace/internal/exampletest"
	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/tiers"
)

// llm runs the example with args and returns its summary.
func llm(t *testing.T, args ...string) summary {
	t.Helper()
	s := exampletest.RunJSON[summary](t, args...)
	t.Logf("llm %s: %s: %d accepted, %d tokens, %.1f%% of the %s, %d 429s",
		strings.Join(args, " "), s.Mode, s.Accepted, s.TokensUsed, 100*s.Utilisation, s.Binding, s.TooMany)
	return s
}

// TestLLM: with its defaults, settling, the batch uses at least 95% of the
// binding limit (tokens) with at most one 429, and without the API's
// headers too; reserving max_tokens and never settling, it uses at least a
// fifth less, unless the API's headers, which count what the answers used,
// steer it: then 93% or more again (each process syncs at most every 50 ms,
// and books at max_tokens in between: measured 95.6% to 98.8% beside a CPU hog).
//
// The four runs go at once: each sleeps most of its 6 s (0.5 s of CPU).
// Real processes on the wall clock: make test runs it.
func TestLLM(t *testing.T) {
	tiers.Full(t)
	t.Parallel()
	runs := map[string][]string{
		"settled":                  nil,
		"settled, no counters":     {"-counters=false"},
		"not settled, no counters": {"-settle=false", "-counters=false"},
		"not settled, steered":     {"-settle=false"},
	}
	var mu sync.Mutex
	got := make(map[string]summary)
	t.Run("runs", func(t *testing.T) {
		for name, args := range runs {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := llm(t, args...)
				mu.Lock()
				defer mu.Unlock()
				got[name] = s
			})
		}
	})
	settled := got["settled"]
	if settled.Binding != "tokens" || settled.Utilisation < 0.95 || settled.TooMany > 1 || settled.Answered < settled.Accepted*9/10 {
		t.Errorf("settled: %s bind at %.3f, %d 429s, %d answered of %d accepted; want tokens at 0.95 or more, at most one 429, answers to all but those cut at the end",
			settled.Binding, settled.Utilisation, settled.TooMany, settled.Answered, settled.Accepted)
	}
	if blind := got["settled, no counters"]; blind.Utilisation < 0.95 || blind.TooMany > 1 {
		t.Errorf("settled, no counters: %.3f of the tokens and %d 429s; want 0.95 or more, at most one", blind.Utilisation, blind.TooMany)
	}
	if unsettled := got["not settled, no counters"]; unsettled.TooMany > 1 || unsettled.Utilisation > 0.8*settled.Utilisation {
		t.Errorf("not settled, no counters: %.3f of the tokens and %d 429s; want at most 0.8 of the settled run's %.3f", unsettled.Utilisation, unsettled.TooMany, settled.Utilisation)
	}
	if steered := got["not settled, steered"]; steered.TooMany > 1 || steered.Utilisation < 0.93 {
		t.Errorf("not settled, steered by the counters: %.3f of the tokens and %d 429s; want 0.93 or more, at most one", steered.Utilisation, steered.TooMany)
	}
}

// TestLLMRuns: the batch runs with its defaults for a second, every answer
// counted, none refused beyond the first: what go test alone checks of the
// example (TestLLM measures it).
func TestLLMRuns(t *testing.T) {
	t.Parallel()
	s := llm(t, "-duration", "1s")
	if s.Accepted == 0 || s.TooMany > 1 {
		t.Errorf("%d accepted, %d 429s; want some accepted, at most one 429", s.Accepted, s.TooMany)
	}
}

// TestLLMOnRedis: the same against a real redis-server, by URL.
func TestLLMOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if s := llm(t, "-redis", "redis://"+srv.Addr+"/0"); s.Utilisation < 0.95 || s.TooMany > 1 {
		t.Errorf("-redis: %s bind at %.3f, %d 429s", s.Binding, s.Utilisation, s.TooMany)
	}
}

// TestFlags: a flag that cannot work is an error that names it.
func TestFlags(t *testing.T) {
	for flag, c := range map[string]config{
		"-procs":    {Procs: 0, Workers: 1, Duration: 1, Requests: "1/s", Tokens: "1/s"},
		"-workers":  {Procs: 1, Workers: 0, Duration: 1, Requests: "1/s", Tokens: "1/s"},
		"-duration": {Procs: 1, Workers: 1, Duration: 0, Requests: "1/s", Tokens: "1/s"},
		"-tokens":   {Procs: 1, Workers: 1, Duration: 1, Requests: "1/s", Tokens: "many"},
		"-requests": {Procs: 1, Workers: 1, Duration: 1, Requests: "0/s", Tokens: "1/s"},
	} {
		if err := c.check(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%+v: %v, want an error naming %s", c, err, flag)
		}
	}
}
