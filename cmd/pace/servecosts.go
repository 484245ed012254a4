package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/fleetpace/pace"
)

// A costDialect is how an API counts a request's tokens: the limits of a
// route it counts them under, what a request is estimated at from its
// prompt's tokens and those it may answer with, and what settles it from
// the response's usage, under the limits of the route's quota it names.
type costDialect struct {
	limits   []string
	estimate func(prompt, out int) pace.Costs
	settler  func(limits map[string]string) pace.Settler
}

// costDialects are the APIs a route's costs may speak, by name.
var costDialects = map[string]costDialect{
	"openai": { // total tokens, as OpenAI's TPM counts them
		limits:   []string{"tokens"},
		estimate: func(prompt, out int) pace.Costs { return pace.Costs{"tokens": prompt + out} },
		settler:  func(map[string]string) pace.Settler { return pace.OpenAIUsage("tokens") },
	},
	"anthropic": { // Anthropic's ITPM and OTPM, either or both
		limits:   []string{"input", "output"},
		estimate: func(prompt, out int) pace.Costs { return pace.Costs{"input": prompt, "output": out} },
		settler: func(limits map[string]string) pace.Settler {
			named := func(name string) string {
				if _, ok := limits[name]; ok {
					return name
				}
				return ""
			}
			return pace.AnthropicUsage(named("input"), named("output"))
		},
	},
}

// checkCostLimits says when c's costs name limits that its quota lacks.
func checkCostLimits(c routeConfig, quota []pace.Limit) error {
	if c.Costs == "" {
		return nil
	}
	names := costDialects[c.Costs].limits
	for _, name := range names {
		if _, ok := c.Limits[name]; ok {
			return nil
		}
	}
	return fmt.Errorf("costs %q: want limits named %v, which it counts tokens under (have %v)", c.Costs, names, quota)
}

// settler returns the Settler of c's API's usage, under the limits of
// its quota it counts.
func settler(c routeConfig) pace.Settler { return costDialects[c.Costs].settler(c.Limits) }

// A costsKey is the context key of a request's estimated costs.
type costsKey struct{}

// estimated is a Rule's Estimate: the costs withEstimate put on the
// request's context.
func estimated(req *http.Request) pace.Costs {
	costs, _ := req.Context().Value(costsKey{}).(pace.Costs)
	return costs
}

// headSize is how much of r's body an estimate reads: none when it has
// none, or its Content-Length says it is longer than pace.MaxEstimatedBody (its
// length alone says its tokens); all of it when its length is known; else
// up to one byte past pace.MaxEstimatedBody, which tells a body too long.
func headSize(r *http.Request) int64 {
	switch {
	case r.Body == nil || r.Body == http.NoBody || r.ContentLength > pace.MaxEstimatedBody:
		return 0
	case r.ContentLength >= 0:
		return r.ContentLength
	}
	return pace.MaxEstimatedBody + 1
}

// withEstimate returns ctx with r's estimated costs: its prompt's tokens
// from its body's size, and its response's from its max_tokens (or the
// route's max_tokens), each at most its limit's burst. It reads the first
// hold bytes of r's body at most (see headSize; 0: none, the body's length
// alone says its tokens), in one allocation, and puts them back.
func withEstimate(ctx context.Context, r *http.Request, c routeConfig, bursts map[string]int, hold int64) (context.Context, error) {
	var head []byte
	if hold > 0 {
		head = make([]byte, hold)
		n, err := io.ReadFull(r.Body, head)
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF { // EOF: an empty body
			return nil, fmt.Errorf("request body: %w", err)
		}
		head = head[:n]
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
	}
	prompt, out := pace.RequestTokens(head, r.ContentLength, c.MaxTokens)
	costs := costDialects[c.Costs].estimate(prompt, out)
	for name, cost := range costs {
		if burst, ok := bursts[name]; ok {
			costs[name] = min(cost, burst) // so that a long request waits for a full bucket, never fails
		}
	}
	return context.WithValue(ctx, costsKey{}, costs), nil
}
