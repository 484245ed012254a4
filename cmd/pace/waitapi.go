package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fleetpace/pace"
)

// waitPath is the wait endpoint's path: work that does not pass through
// the proxy (a crawler's own downloads, a queue's tasks) waits there for
// its turn under a route's quota.
const waitPath = "/pace/v1/wait"

// A waitRequest is the body of a POST to waitPath.
type waitRequest struct {
	// Route names the route whose limiter decides; it may be left out
	// when the server has one route.
	Route string `json:"route"`
	// Key is the key to wait on; empty, the key of the requests the
	// route proxies, so that both share one bucket. A key is the route's
	// if it begins with the route's name and a bar (as the keys of the
	// requests it proxies do), and booked under its limit; or with the
	// name of one of its rules and a bar, and booked under the rule's.
	// Any other is refused: a route cannot reach another's buckets.
	Key string `json:"key"`
	// Cost is what the work takes; 0 means 1.
	Cost int `json:"cost"`
	// TimeoutMS bounds the wait, in milliseconds, below the route's
	// max_wait; 0 means the route's max_wait.
	TimeoutMS int64 `json:"timeout_ms"`
	// Credential asks, on a route with a pool of credentials
	// (api_keys_env), which one the wait was granted on: the reply names
	// its variable, never its value. A wait on such a route is booked on
	// one of them either way.
	Credential bool `json:"credential"`
}

// A waitReply is the wait endpoint's answer to a granted wait.
type waitReply struct {
	Key        string `json:"key"`
	WaitedMS   int64  `json:"waited_ms"`
	Credential string `json:"credential,omitempty"` // when asked: the name of the credential granted
}

// maxWaitBody bounds a wait request's body.
const maxWaitBody = 64 << 10

// waitHandler answers the wait endpoint for routes: 200 once granted, 429
// with Retry-After when the wait would pass its timeout (booking nothing),
// 400 for a bad request, 404 for an unknown route, 503 while shutting down.
func waitHandler(routes []*route) http.HandlerFunc {
	byName := map[string]*route{}
	for _, rt := range routes {
		byName[rt.config.Name] = rt
	}
	return func(w http.ResponseWriter, r *http.Request) {
		var req waitRequest
		decoder := json.NewDecoder(io.LimitReader(r.Body, maxWaitBody))
		decoder.DisallowUnknownFields()
		if err := decoder.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("wait request: %w", err), 0)
			return
		}
		if req.Route == "" && len(routes) == 1 {
			req.Route = routes[0].config.Name
		}
		rt, ok := byName[req.Route]
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Errorf("route %q: no such route", truncate(req.Route)), 0)
			return
		}
		rt.serveWait(w, r, req)
	}
}

// serveWait waits for req under the route's limit.
func (rt *route) serveWait(w http.ResponseWriter, r *http.Request, req waitRequest) {
	if req.Cost == 0 {
		req.Cost = 1
	}
	if req.Key == "" {
		req.Key = rt.key
	}
	if req.TimeoutMS < 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("timeout_ms %d: want 0 (the route's max_wait) or more", req.TimeoutMS), 0)
		return
	}
	if req.Credential && rt.pool == nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("credential: route %q has no pool of credentials (api_keys_env)", rt.config.Name), 0)
		return
	}
	limiter, err := rt.limiterOf(req.Key)
	if err != nil {
		writeError(w, http.StatusBadRequest, err, 0)
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	defer context.AfterFunc(rt.stopping, func() { cancel(errShuttingDown) })()
	if req.TimeoutMS > 0 {
		var cancelTimeout context.CancelFunc
		ctx, cancelTimeout = context.WithTimeout(ctx, time.Duration(min(req.TimeoutMS, pace.MaxDelay.Milliseconds()))*time.Millisecond)
		defer cancelTimeout()
	}
	start := time.Now()
	credential, err := rt.wait(ctx, limiter, req.Key, req.Cost)
	var late *pace.DeadlineError
	switch {
	case err == nil:
		reply := waitReply{Key: req.Key, WaitedMS: time.Since(start).Milliseconds()}
		if req.Credential {
			reply.Credential = credential
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(reply)
	case errors.As(err, &late):
		writeError(w, http.StatusTooManyRequests, err, late.Delay)
	case errors.Is(context.Cause(ctx), errShuttingDown):
		writeError(w, http.StatusServiceUnavailable, errShuttingDown, time.Second)
	case errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusTooManyRequests, err, time.Second)
	case r.Context().Err() != nil:
		// The client left, and its tokens went back.
	default:
		writeError(w, http.StatusBadRequest, err, 0)
	}
}

// limiterOf returns the limiter of the route that books key: its own, for
// a key beneath its name; a rule's, for a key beneath the rule's name.
func (rt *route) limiterOf(key string) (*pace.Redis, error) {
	space, _, _ := strings.Cut(key, "|")
	if space == rt.config.Name {
		return rt.limiter, nil
	}
	if limiter, ok := rt.ruled[space]; ok {
		return limiter, nil
	}
	return nil, fmt.Errorf("key %q: not route %q's: want a key that begins with %q, or a limiting rule's name and a bar", truncate(key), rt.config.Name, rt.config.Name+"|")
}

// wait waits for cost on key under limiter, the route's own or a rule's,
// and returns the name of the credential of the route's pool it was
// granted on ("" without a pool); under the route's cap in flight, the
// work takes a slot for the wait alone, since pace cannot see when it
// ends.
func (rt *route) wait(ctx context.Context, limiter *pace.Redis, key string, cost int) (string, error) {
	switch {
	case rt.pool != nil:
		c, err := rt.pool.Wait(ctx, limiter, key, cost)
		return c.Name, err
	case rt.config.InFlight == 0 || limiter != rt.limiter:
		return "", limiter.Wait(ctx, key, cost)
	}
	slot, err := rt.limiter.Acquire(ctx, key, cost)
	if err != nil {
		return "", err
	}
	return "", slot.Release()
}
