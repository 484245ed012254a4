package main

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/quotaapi"
)

// startUpstream starts the built-in API of c's run, which starts at start.
// It enforces the quota strictly and answers 429 beyond it: without
// -headers or with -headers openai, a token bucket of the limit's rate and
// burst, and -slack tokens beyond it (by default one: the jitter between a
// grant in Redis and the request's arrival here could otherwise cost a 429
// at the very start; 0 is the strict bucket of the limit itself); with
// -headers github or ietf, a fixed window ten times as long as the run
// (whole seconds), of the limit's rate times its length, from the start
// on. With -headers, it
// states its counters in that dialect; with -retry-after, it answers one
// 429 with Retry-After: 1, a third into the run; with -retry-after-each N,
// every 429 says Retry-After: N; with -foreign, a foreign
// client spends the same quota, without pace, from start on; with
// -concurrency, it takes 50 ms to answer each request.
func startUpstream(c config, limit pace.Limit, start time.Time) (*quotaapi.Server, error) {
	dialect, _ := quotaapi.ParseDialect(c.Headers)
	q := quotaapi.Config{Dialect: dialect, Rate: limit.Rate(), Burst: limit.Burst() + c.Slack}
	if c.Concurrency > 0 {
		q.Service = service
	}
	if dialect.Windowed() {
		q.Window = 10 * max(c.Duration.Round(time.Second), time.Second)
		q.Count = int(math.Round(limit.Rate() * q.Window.Seconds()))
		q.WindowsFrom = start
	}
	if c.RetryEach > 0 {
		q.RetryAfter = strconv.Itoa(c.RetryEach)
	}
	if c.RetryAfter {
		q.Once = quotaapi.Once{At: start.Add(c.Duration / 3), Status: http.StatusTooManyRequests, Header: "Retry-After", Value: "1"}
	}
	api, err := quotaapi.Start(q)
	if err != nil || c.Foreign == 0 {
		return api, err
	}
	time.AfterFunc(time.Until(start), func() { api.StartForeign(c.Foreign) })
	return api, nil
}
