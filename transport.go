// Package pace lets a fleet of HTTP clients spend one upstream API quota
// together.
//
// A Transport is an http.RoundTripper that, before each request, waits on a
// Limiter: Redis shares one token bucket per key across every process that
// uses the same Redis, with one atomic script call per decision on Redis's own
// clock; Local paces within one process with golang.org/x/time/rate. A wait is
// a reservation, not polling: the limiter books the caller's slot and returns
// the exact delay, and the caller sleeps on one timer. A wait that would pass
// the request's deadline fails at once and books nothing; a request cancelled
// while it waits gives its tokens back.
//
// For a limit of rate r and burst b, over any interval of length t the grants
// for one key are at most b + r*t, summed over the whole fleet.
//
// When Redis fails, a Redis limiter decides by its FailurePolicy, by default
// pacing locally at this process's share of the limit, leaves Redis alone for
// a growing cool-down, and goes back to the shared limit by itself once a
// probe finds Redis again. An Observer sees every decision and every switch;
// pace never logs.
package pace

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"time"
)

// Transport is an http.RoundTripper that waits on Limiter before passing each
// request to Base. It does not retry: wrap it in a retrying client (such as
// github.com/hashicorp/go-retryablehttp) and every attempt pays its own way.
//
// A Transport is safe for concurrent use. The zero value passes requests to
// http.DefaultTransport without pacing.
type Transport struct {
	// Base sends the requests. If nil, http.DefaultTransport is used.
	Base http.RoundTripper

	// Limiter paces the requests. If nil, requests are not paced.
	Limiter Limiter

	// Key names the bucket a request draws on. If nil, HostKey is used.
	// A Key that returns "" makes the request fail.
	Key func(*http.Request) string

	// Cost is how many tokens a request takes. If nil, each takes 1.
	Cost func(*http.Request) int

	// MaxHold caps how long a response can hold its key (see ParseHold and
	// Holder). If zero, DefaultMaxHold is used.
	MaxHold time.Duration

	// Rules, if set, decide each request's limiter, key and cost, and
	// Limiter, Key and Cost are not used.
	Rules *Rules
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip waits until the Limiter grants the request's cost under its key,
// or its context ends, then sends it with Base and returns Base's response
// and error untouched. It never modifies the request, and closes its body on
// every path where Base does not receive it. When the response says the
// key's quota is spent (ParseHold) and the Limiter is a Holder, the key is
// held for the whole fleet before RoundTrip returns.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Limiter == nil && t.Rules == nil {
		return t.base().RoundTrip(req)
	}
	limiter, key, err := t.wait(req)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := t.base().RoundTrip(req)
	if holder, ok := limiter.(Holder); ok && err == nil && resp != nil {
		if h, ok := ParseHold(resp, time.Now(), t.maxHold()); ok {
			holder.Hold(req.Context(), key, h) // a failure reaches the Limiter's observer
		}
	}
	return resp, err
}

// wait waits for the request's turn and returns the limiter that granted
// it (nil when none paces it) and its key.
func (t *Transport) wait(req *http.Request) (Limiter, string, error) {
	if req.URL == nil {
		return nil, "", errors.New("pace: request has no URL")
	}
	if t.Rules != nil {
		rule, key, cost, err := t.Rules.decide(req)
		if err != nil || rule.Unlimited {
			return nil, key, err
		}
		return rule.Limiter, key, rule.Limiter.Wait(req.Context(), key, cost)
	}
	keyOf := HostKey
	if t.Key != nil {
		keyOf = t.Key
	}
	cost := 1
	if t.Cost != nil {
		cost = t.Cost(req)
	}
	key := keyOf(req)
	return t.Limiter, key, t.Limiter.Wait(req.Context(), key, cost)
}

func (t *Transport) maxHold() time.Duration {
	if t.MaxHold > 0 {
		return t.MaxHold
	}
	return DefaultMaxHold
}

// CloseIdleConnections closes the idle connections of Base, if it has such a
// method.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if c, ok := t.base().(closeIdler); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// HostKey is the default key of a request: its URL's host, lower-cased, with
// the port, which is the scheme's default when the URL names none
// ("api.example.com:443"). So each upstream server has its own bucket.
func HostKey(req *http.Request) string {
	host, port := req.URL.Hostname(), req.URL.Port()
	if host == "" {
		return ""
	}
	if port == "" {
		switch strings.ToLower(req.URL.Scheme) {
		case "https", "wss":
			port = "443"
		case "http", "ws":
			port = "80"
		default:
			return strings.ToLower(req.URL.Host)
		}
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}
