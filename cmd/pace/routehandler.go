package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/pace"
)

// The request headers a client may tell pace serve its wishes in; none
// of them reaches the upstream.
const (
	// maxWaitHeader bounds one request's wait, below the route's
	// max_wait: a Go duration ("250ms") or seconds ("2.5"); 0 lets it go
	// only if it is free now.
	maxWaitHeader = "X-Pace-Max-Wait"
)

// ServeHTTP waits for the request's turn in pace, then proxies it.
//
// The upstream's answer may start while the body is still on its way up:
// the transport sends the body and reads the answer at once, and reads the
// body once more after its Content-Length to see it end. By default an
// HTTP/1 server drains and closes a request's body as its handler starts
// to answer, which cut that read short (the upstream's connection closed
// after a stream's first event) or held the answer until the whole body
// had come; full duplex keeps the body open until ServeHTTP returns
// (HTTP/2 is full duplex always).
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).EnableFullDuplex()
	ctx, cancel, err := rt.waitContext(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err, 0)
		return
	}
	defer cancel()
	if rt.config.Costs != "" {
		// The start of the body is held for the estimate while the
		// server's budget of held bytes lasts; past it, the body's
		// length alone says its tokens.
		hold := headSize(r)
		if give := rt.buffer.Take(hold); give != nil {
			defer give()
		} else {
			hold = 0
		}
		if ctx, err = withEstimate(ctx, r, rt.config, rt.bursts, hold); err != nil {
			writeError(w, http.StatusBadRequest, err, 0)
			return
		}
	}
	rt.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// waitContext returns the context r waits in: the client's, ended by its
// own deadline (maxWaitHeader) and by the server's shutdown, within the
// server's budget of bodies held (max_buffered), carrying its
// class (the route's class_header) and, for the request that goes
// upstream once granted, the client's own context. The proxy closes every
// answer's body, so a slot under in_flight is held until then however
// slowly the client reads.
func (rt *route) waitContext(r *http.Request) (context.Context, context.CancelFunc, error) {
	client := r.Context()
	ctx, cancel := context.WithCancelCause(pace.WithBodyBudget(pace.WithBodyAlwaysClosed(context.WithValue(client, upstreamKey{}, client)), rt.buffer.Take))
	stop := context.AfterFunc(rt.stopping, func() { cancel(errShuttingDown) })
	release := func() { stop(); cancel(nil) }
	if h := rt.config.ClassHeader; h != "" && r.Header.Get(h) != "" {
		class, err := parseClass(r.Header.Get(h))
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("%s: %w", h, err)
		}
		ctx = pace.WithClass(ctx, class)
	}
	if v := r.Header.Get(maxWaitHeader); v != "" {
		budget, err := parseWait(v)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("%s: %w", maxWaitHeader, err)
		}
		ctx = pace.WithWaitBudget(ctx, budget) // 0: only if free now
		if budget == 0 {
			return ctx, release, nil
		}
		var cancelBudget context.CancelFunc
		ctx, cancelBudget = context.WithTimeout(ctx, budget)
		return ctx, func() { cancelBudget(); release() }, nil
	}
	return ctx, release, nil
}

// parseClass reads a class by its name.
func parseClass(s string) (pace.Class, error) {
	for _, c := range []pace.Class{pace.ClassDefault, pace.ClassCritical, pace.ClassBatch} {
		if strings.EqualFold(s, c.String()) {
			return c, nil
		}
	}
	return 0, fmt.Errorf("class %q: want critical, default or batch", truncate(s))
}

// parseWait reads a wait: a Go duration, or seconds.
func parseWait(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		seconds, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(seconds) || seconds > pace.MaxDelay.Seconds() {
			return 0, fmt.Errorf("%q: want a duration (250ms) or seconds (2.5)", truncate(s))
		}
		d = time.Duration(seconds * float64(time.Second))
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: want a wait of 0 or more", truncate(s))
	}
	return d, nil
}

// refuse answers a request that got no response: a wait past its
// deadline is a 429 whose Retry-After is the wait it would have had; a
// shutdown's, a 503; anything else, a 502. A request with a body closes
// its connection: what is left of the body is never read.
func (rt *route) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if r.ContentLength != 0 {
		// A body unread stays on the connection, where the server would
		// take it for the next request: the connection ends instead.
		w.Header().Set("Connection", "close")
	}
	var late *pace.DeadlineError
	switch {
	case errors.As(err, &late):
		writeError(w, http.StatusTooManyRequests, err, late.Delay)
	case errors.Is(context.Cause(r.Context()), errShuttingDown):
		writeError(w, http.StatusServiceUnavailable, errShuttingDown, time.Second)
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Value(upstreamKey{}).(context.Context).Err() == nil:
		writeError(w, http.StatusTooManyRequests, err, time.Second) // in line for a slot
	case r.Context().Err() != nil:
		// The client left: no one reads an answer.
	default:
		slog.Warn("pace serve: the upstream did not answer", "route", rt.config.Name, "err", err)
		writeError(w, http.StatusBadGateway, err, 0)
	}
}

// An errorReply is the body of pace serve's own answers.
type errorReply struct {
	Error        string `json:"error"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// writeError answers status with err, and, when retry is set, a
// Retry-After of retry in whole seconds, rounded up.
func writeError(w http.ResponseWriter, status int, err error, retry time.Duration) {
	reply := errorReply{Error: err.Error()}
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(retry.Seconds())), 10))
		reply.RetryAfterMS = retry.Milliseconds()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(reply)
}

// truncate returns the first 64 bytes of a value a client sent, for an
// error that names it.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
