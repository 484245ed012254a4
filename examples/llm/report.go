package main

import (
	"fmt"
	"io"

	"github.com/fleetpace/pace"
)

// summary is what the example reports, as a table or as JSON.
type summary struct {
	Requests         string  `json:"requests_limit"`
	Tokens           string  `json:"tokens_limit"`
	Mode             string  `json:"mode"`
	Processes        int     `json:"processes"`
	Workers          int     `json:"workers"`
	Seconds          float64 `json:"seconds"`
	Accepted         int     `json:"accepted"` // by the API, within its quota, during the run
	Answered         int     `json:"answered"` // answers the workers read before the end
	TooMany          int     `json:"too_many_requests"`
	TokensUsed       int     `json:"tokens_used"`
	RequestsUse      float64 `json:"requests_utilisation"` // answered / (burst + rate*seconds)
	TokensUse        float64 `json:"tokens_utilisation"`   // tokens used / (burst + rate*seconds)
	Binding          string  `json:"binding_limit"`        // the limit more used: "requests" or "tokens"
	Utilisation      float64 `json:"utilisation"`          // of the binding limit
	TokensPerRequest float64 `json:"tokens_per_request"`
}

func summarize(c config, requests, tokens pace.Limit, upstream *api, reports []report) summary {
	s := summary{Requests: requests.String(), Tokens: tokens.String(), Mode: "reserved, settled at the answer's usage",
		Processes: c.Procs, Workers: c.Procs * c.Workers, Seconds: c.Duration.Seconds()}
	if !c.Settle {
		s.Mode = "reserved at max_tokens, never settled"
	}
	if c.Counters {
		s.Mode += ", steered by the API's x-ratelimit headers"
	}
	for _, r := range reports {
		s.Answered += r.Statuses[200]
	}
	s.Accepted, s.TooMany, s.TokensUsed = upstream.counts()
	allows := func(l pace.Limit) float64 { return float64(l.Burst()) + l.Rate()*s.Seconds }
	s.RequestsUse = float64(s.Accepted) / allows(requests)
	s.TokensUse = float64(s.TokensUsed) / allows(tokens)
	s.Binding, s.Utilisation = "tokens", s.TokensUse
	if s.RequestsUse > s.TokensUse {
		s.Binding, s.Utilisation = "requests", s.RequestsUse
	}
	if s.Accepted > 0 {
		s.TokensPerRequest = float64(s.TokensUsed) / float64(s.Accepted)
	}
	return s
}

func (s summary) print(w io.Writer) {
	fmt.Fprintf(w, "quota           %s requests and %s tokens, shared through Redis\n", s.Requests, s.Tokens)
	fmt.Fprintf(w, "mode            %s\n", s.Mode)
	fmt.Fprintf(w, "fleet           %d processes, %d workers, %.1fs\n", s.Processes, s.Workers, s.Seconds)
	fmt.Fprintf(w, "accepted        %d requests (%d answered before the end), %.0f tokens each on average\n", s.Accepted, s.Answered, s.TokensPerRequest)
	fmt.Fprintf(w, "tokens used     %d\n", s.TokensUsed)
	fmt.Fprintf(w, "utilisation     %.1f%% of the requests, %.1f%% of the tokens (burst + rate x time): %s bind\n", 100*s.RequestsUse, 100*s.TokensUse, s.Binding)
	fmt.Fprintf(w, "429s            %d\n", s.TooMany)
}
