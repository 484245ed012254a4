package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/examplestore"
)

// workerEnv, when set, makes the program a worker process, configured by
// the JSON job in the variable.
const workerEnv = "PACE_LLM_WORKER"

// The prompts: from 40 to maxPromptBytes bytes of text, each asking for
// minMaxTokens to maxMaxTokens tokens of answer.
const (
	maxPromptBytes = 240
	minMaxTokens   = 100
	maxMaxTokens   = 400
)

// job is what the example tells one worker process.
type job struct {
	Config config
	Redis  string // the Redis URL to use
	Target string // the API's URL
	Start  time.Time
}

// report is what a worker process prints on stdout.
type report struct {
	Statuses map[int]int // the answers it read, by status
}

// run sends prompts from each of the job's workers, one after another,
// until the end of the run.
func (j job) run() (report, error) {
	quota, err := j.Config.quota()
	if err != nil {
		return report{}, err
	}
	limiter, closeLimiter, err := examplestore.Limiter(j.Redis, quota)
	if err != nil {
		return report{}, err
	}
	defer closeLimiter()
	base := &http.Transport{MaxIdleConnsPerHost: j.Config.Workers}
	defer base.CloseIdleConnections()
	transport := &pace.Transport{Base: base, Limiter: limiter, Estimate: estimate, IgnoreCounters: !j.Config.Counters}
	if j.Config.Settle {
		transport.Settle = pace.OpenAIUsage("tokens")
	}
	client := &http.Client{Transport: transport}
	// Before the start: a connection, the scripts, the first heartbeats.
	if err := limiter.Wait(context.Background(), "warm-up", 1); err != nil {
		return report{}, err
	}

	end := j.Start.Add(j.Config.Duration)
	r := report{Statuses: map[int]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	time.Sleep(time.Until(j.Start))
	for range j.Config.Workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				status, err := prompt(client, j.Target, end)
				if status != 0 {
					mu.Lock()
					r.Statuses[status]++
					mu.Unlock()
				}
				if errors.Is(err, context.DeadlineExceeded) {
					return // the run is over
				}
			}
		})
	}
	wg.Wait()
	return r, nil
}

// prompt sends one chat request, half of them streamed, reads the answer
// to its end, and returns its status (0 if none).
func prompt(client *http.Client, target string, end time.Time) (int, error) {
	text := strings.Repeat("pace shares one quota across a fleet. ", 7)[:40+rand.IntN(maxPromptBytes-40)]
	body, _ := json.Marshal(map[string]any{
		"model":          "loopback",
		"messages":       []map[string]string{{"role": "user", "content": text}},
		"max_tokens":     minMaxTokens + rand.IntN(maxMaxTokens-minMaxTokens+1),
		"stream":         rand.IntN(2) == 0,
		"stream_options": map[string]bool{"include_usage": true},
	})
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// estimate is the Transport's Estimate: a request takes 1 request and, in
// tokens, its prompt and its max_tokens, the count the API charges when it
// arrives. It reads the body from GetBody, leaving the request as it is.
func estimate(req *http.Request) pace.Costs {
	var chat chatRequest
	if req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			json.NewDecoder(body).Decode(&chat)
			body.Close()
		}
	}
	_, tokens := chat.estimate()
	return pace.Costs{"tokens": max(tokens, 1)}
}

// quota is the API's quota as pace paces it.
func (c config) quota() (pace.Quota, error) {
	requests, tokens, err := c.limits()
	return pace.AllOf(requests, tokens), err
}

// limits are the API's two limits, named as its costs name them.
func (c config) limits() (requests, tokens pace.Limit, err error) {
	if requests, err = pace.ParseLimit(c.Requests); err != nil {
		return requests, tokens, fmt.Errorf("-requests: %w", err)
	}
	if tokens, err = pace.ParseLimit(c.Tokens); err != nil {
		return requests, tokens, fmt.Errorf("-tokens: %w", err)
	}
	return requests.Named("requests"), tokens.Named("tokens"), nil
}
