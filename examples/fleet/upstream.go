package main

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetpace/pace"
)

// upstream is the built-in API: it enforces the quota strictly with a token
// bucket of the same rate and one token of slack (the jitter between a grant
// in Redis and the request's arrival here could otherwise cost one 429 at
// the very start), and answers 429 beyond it.
type upstream struct {
	bucket     *rate.Limiter
	retryAt    time.Time // when to answer one 429 with Retry-After: 1; zero for never
	served     atomic.Int64
	refused    atomic.Int64
	retryAfter sync.Once
	server     *http.Server
	addr       string
}

func startUpstream(limit pace.Limit, retryAt time.Time) (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{bucket: rate.NewLimiter(rate.Limit(limit.Rate()), limit.Burst()+1), retryAt: retryAt, addr: ln.Addr().String()}
	u.server = &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second}
	go u.server.Serve(ln)
	return u, nil
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !u.retryAt.IsZero() && time.Now().After(u.retryAt) {
		spoke := false
		u.retryAfter.Do(func() { spoke = true })
		if spoke {
			u.refused.Add(1)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
	}
	if !u.bucket.Allow() {
		u.refused.Add(1)
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	n := u.served.Add(1)
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte("ok " + strconv.FormatInt(n, 10) + "\n"))
}

func (u *upstream) close() { u.server.Close() }
