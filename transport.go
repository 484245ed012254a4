// Package pace lets a fleet of HTTP clients spend one upstream API quota
// together.
//
// A Transport is an http.RoundTripper that, before each request, waits on a
// Limiter: Redis shares one token bucket per key across every process that
// uses the same Redis, with one atomic script call per decision on Redis's own
// clock; Local paces within one process with golang.org/x/time/rate. A wait is
// a reservation, not polling: the limiter books the caller's time and returns
// the exact delay, and the caller sleeps on one timer. A wait that would pass
// the request's deadline fails at once and books nothing; a request cancelled
// while it waits gives its tokens back.
//
// For a limit of rate r and burst b, over any interval of length t the grants
// for one key are at most b + r*t, summed over the whole fleet.
//
// A first program needs five names, in the order it meets them: ParseLimit
// (or PerSecond, PerMinute...) says the quota; NewRedis (or NewLocal, in one
// process) makes the limiter; a Transport on it is an http.Client's; a request
// whose wait would pass its context's deadline fails at once with a
// *DeadlineError, which a loop stops on; and work that is not HTTP waits
// with the limiter's Wait, or takes a turn only if it is free now with its
// Allow. The rest is grouped by what it is for: quotas (AllOf, Daily,
// Concurrent, Limit.Learn), costs settled from the response (Reserve,
// Settler), the fleet (WithFleetSize, Process, Pool), failures
// (FailurePolicy, Redis.Check) and what happened (Observer, Event).
//
// A Transport on Redis also reads the upstream's counters in every response
// (how much is left, when it resets: headers.ParseReadings) and steers the key with
// them for the whole fleet (Redis.Sync): it leaves others their share of a
// quota pace does not see whole, spreads a window's rest instead of
// bursting and stalling, and can learn the limit the upstream advertises
// (Limit.Learn). A refusal that nothing in the response explains cuts the
// key's rate for the whole fleet, which then climbs back as requests are
// served, never above the configured limit (see EventRate). Nothing a
// response says can delay a key beyond the limiter's MaxHold (WithMaxHold).
//
// A quota may also cap the requests in flight (Concurrent): a request then
// holds a slot, a lease in Redis, until its response body ends. And
// requests have priority classes (Class): a batch backlog never makes a
// critical request wait behind it.
//
// A Transport asks Local or Redis one thing per request, through a protocol
// of pace's own, unexported: its slot, its booking, what its response says,
// its settlement. Any other Limiter (a decorator, one that embeds *Redis
// or *Local too, a test's fake) is waited on, and no more. A decorator that had to forward six exported interfaces
// to be steered as the limiter it wrapped was the widest seam of the
// package, and each new thing a response could say widened it; an Observer
// sees every decision without standing between the two.
//
// When Redis fails, a Redis limiter decides by its FailurePolicy, by default
// pacing locally at this process's share of the limit, leaves Redis alone for
// a growing cool-down, and goes back to the shared limit by itself once a
// probe finds Redis again. An Observer sees every decision and every switch;
// pace never logs.
package pace

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/store"
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

	// Cost is how many tokens a request takes under every limit. If nil,
	// each takes 1.
	Cost func(*http.Request) int

	// Estimate, if set, gives each request's estimated costs under each
	// limit of its quota, instead of Cost; the Limiter must be Local or Redis.
	// Settle, if set too, reads what the response cost, and the
	// reservation is settled with it once the response body reaches EOF or
	// is closed (see Settler). The body then comes wrapped: it reads the
	// same bytes as they come, and keeps only its first and last
	// BodyEndSize bytes for Settle. A request that gets no response, and one
	// whose body is never closed, keeps its estimate.
	Estimate func(*http.Request) Costs
	Settle   Settler

	// BodyCounters, if set, reads the upstream's counters where it states
	// them in the response body (ShopifyCounters), which then steer the
	// key as its headers' do, once the body ends.
	BodyCounters BodyCounters

	// IgnoreCounters stops the Transport from steering a Redis
	// by the upstream's counters in each response (see headers.ParseReadings and
	// Redis.Sync), which it does by default. Holds are still heeded.
	IgnoreCounters bool

	// IgnoreHolds stops the Transport from holding a key when a response
	// says when to retry (Retry-After, or a body: see headers.ParseHold),
	// which it does by default: for an upstream whose Retry-After means
	// something else, or says more than it holds. A refusal still cuts the
	// key's rate, unless IgnoreRefusals. A Rule can turn holds off for its
	// requests alone.
	IgnoreHolds bool

	// IgnoreRefusals stops the Transport from cutting a key's rate, on
	// Local or Redis, when the upstream refuses a request (a 429 or 503)
	// that no counters explain, also one with a Retry-After, which it does
	// by default: see EventRate, and docs/counters.md. A Rule can turn it off for its requests alone.
	IgnoreRefusals bool

	// Rules, if set, decide each request's limiter, key and cost, and
	// Limiter, Key and Cost are not used.
	Rules *Rules

	// Pool, if set, sends each request with one of its credentials: the
	// one that can go soonest, each under a key of its own on the
	// request's limiter, which must be Local or Redis (see Pool).
	Pool *Pool

	repeats repeatedHolds  // see headers.Hold.Repeats
	clocks  upstreamClocks // see headers.Clock
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip waits until the Limiter grants the request's cost under its key,
// or its context ends, then sends it with Base and returns Base's response
// and error untouched. It never modifies the request, and closes its body on
// every path where Base does not receive it. Before it returns, what the
// response says of the key's quota reaches the Limiter, when it is Local or
// Redis, for the whole fleet (a Limiter of another kind is only waited on):
// when it says the quota is spent (headers.ParseHold), the key is held;
// when it states the upstream's counters (headers.ParseReadings), they
// steer the key on a Redis (Redis.Sync), unless IgnoreCounters; when it refuses
// the request and no counters explain it (a 429 or 503, with a Retry-After or
// without), the key's rate is cut on Local or Redis (see EventRate), unless
// IgnoreRefusals. Under a cap in flight (Concurrent),
// the request holds a slot from before its rate wait until its response
// body reaches EOF or is closed, or Base fails.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Limiter == nil && t.Rules == nil && t.Pool == nil {
		return t.base().RoundTrip(req)
	}
	p, err := t.wait(req)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	if t.Pool != nil {
		req = t.Pool.apply(req, t.Pool.credential(p.at, p.key))
	}
	handed := false // the slot to the response's body
	defer func() {
		if !handed && p.slot != nil {
			p.slot.Release() // Base failed, or panicked
		}
	}()
	sent := time.Now()
	resp, err := t.base().RoundTrip(req)
	if err != nil || resp == nil {
		return resp, err
	}
	arrival := time.Now()
	p.heed(req.Context(), resp, sent, arrival, t)
	if p.slot != nil || (p.res != nil && p.settle != nil) || p.readsBody() {
		resp.Body, handed = p.endingBody(req.Context(), resp, arrival), true
	}
	return resp, err
}

// pacing is how a Transport paced one request: by which limiter (nil when
// none paces it), under which key, and, for a request whose costs are
// estimated, its reservation and the Settler of its response. On a limiter
// of pace's own (a backend), grant is what the request booked, scope what its
// response may steer, and, under a cap in flight, slot is the request's,
// until its response ends.
type pacing struct {
	limiter  Limiter
	backend  backend // limiter, when it is pace's own
	key      string
	at       target // what the wait booked on: key, or a Pool's keys (key is then the one booked)
	res      *Reservation
	settle   Settler
	counters BodyCounters // reads the counters its body states
	grant    grant
	scope    heedScope
	slot     *Slot
	class    Class // the Rule's, for a request whose context carries none
}

// wait waits for the request's turn, and returns how it was paced.
func (t *Transport) wait(req *http.Request) (pacing, error) {
	if req.URL == nil {
		return pacing{}, errors.New("pace: request has no URL")
	}
	if t.Pool != nil {
		if err := t.Pool.checked(); err != nil {
			return pacing{}, err
		}
	}
	rule, key, cost, err := t.decide(req)
	if err != nil || rule.Unlimited {
		return pacing{key: key, at: t.target(key, req)}, err
	}
	scope := heedScope{holds: !t.IgnoreHolds && !rule.IgnoreHolds, counters: !t.IgnoreCounters, refusals: !t.IgnoreRefusals && !rule.IgnoreRefusals}
	return t.waitFor(req, pacing{limiter: rule.Limiter, key: key, settle: rule.Settle, counters: rule.BodyCounters, class: rule.Class, scope: scope}, cost, rule.Estimate)
}

// decide returns the rule that paces req, its key and its cost: by t's
// Rules, or, without them, by t's own fields, which are then the one rule.
func (t *Transport) decide(req *http.Request) (Rule, string, int, error) {
	if t.Rules != nil {
		rule, key, cost, err := t.Rules.decide(req)
		return *rule, key, cost, err
	}
	switch {
	case t.Settle != nil && t.Estimate == nil:
		return Rule{}, "", 0, errors.New("pace: Transport.Settle without an Estimate: nothing would be reserved to settle")
	case t.Limiter == nil:
		return Rule{}, "", 0, errors.New("pace: Transport.Pool without a Limiter: a Pool's credentials are chosen by what their keys can take")
	case isNil(t.Limiter):
		return Rule{}, "", 0, fmt.Errorf("pace: Transport.Limiter is a nil %T (did the constructor that made it fail?)", t.Limiter)
	}
	keyOf := HostKey
	if t.Key != nil {
		keyOf = t.Key
	}
	cost := 1
	if t.Cost != nil && t.Estimate == nil {
		cost = t.Cost(req)
	}
	return Rule{Limiter: t.Limiter, Estimate: t.Estimate, Settle: t.Settle, BodyCounters: t.BodyCounters}, keyOf(req), cost, nil
}

// target is the target of req's wait, whose key is key: key, or the
// keys of t's Pool.
func (t *Transport) target(key string, req *http.Request) target {
	if t.Pool == nil {
		return target{key: key}
	}
	return t.Pool.target(key, req)
}

// waitFor waits on p's limiter for req. A limiter of a user's is waited
// on for cost. One of pace's own is asked for a slot, when its quota caps
// requests in flight, then for cost under every rate limit, or, with an
// estimate, for a reservation of the estimated costs.
func (t *Transport) waitFor(req *http.Request, p pacing, cost int, estimate func(*http.Request) Costs) (pacing, error) {
	ctx := req.Context()
	if _, set := ctx.Value(classKey{}).(Class); !set && p.class != ClassDefault {
		ctx = WithClass(ctx, p.class)
	}
	var ours bool
	p.at = t.target(p.key, req)
	if p.backend, ours = backendOf(p.limiter); !ours {
		switch {
		case estimate != nil:
			return p, fmt.Errorf("pace: key %s: an Estimate needs a limiter that reserves, Local or Redis, not a %s", store.QuoteKey(p.key), limiterType(p.limiter))
		case t.Pool != nil:
			return p, fmt.Errorf("pace: key %s: a Pool needs a limiter that chooses, Local or Redis, not a %s", store.QuoteKey(p.key), limiterType(p.limiter))
		}
		return p, p.limiter.Wait(ctx, p.key, cost)
	}
	if estimate == nil {
		var err error
		p.slot, p.grant, err = p.backend.admit(ctx, p.at, cost)
		if p.at.pool != nil {
			p.key = p.grant.booking.key
		}
		return p, err
	}
	var slot *Slot
	var err error
	if p.at.pool == nil { // a pool's cap is refused by its reservation
		if slot, err = p.backend.TakeSlot(ctx, p.key); err != nil {
			return p, err
		}
	}
	p.slot, ctx = slot, WithSlot(ctx, slot)
	waited := false
	defer func() {
		if !waited {
			p.slot.Release() // the reservation failed, or Estimate panicked
		}
	}()
	if p.res, err = p.backend.reserveFor(ctx, p.at, estimate(req)); err == nil {
		p.grant, p.key = p.res.granted(), p.res.key
	}
	waited = err == nil
	return p, err
}

// heed hands what resp, to the request sent at sent, which arrived at
// arrival, says of p's key to p's limiter, when it is pace's own: its holds
// (unless p's scope ignores them; on a Pool, a rejected credential's),
// counters and refusals, on the key's upstream clock that t keeps, each
// hold that repeats lengthened by t's repeats. A
// refusal's body is read first (within the context's budget: WithBodyBudget), up to
// headers.BodySize and bodyWait, for the hold it asks for
// (headers.HearBody), and passed on whole. It runs past the request's
// context: the response has been counted already. Failures reach the
// limiter's observer.
func (p pacing) heed(ctx context.Context, resp *http.Response, sent, arrival time.Time, t *Transport) {
	if p.backend == nil {
		return
	}
	repeats := &t.repeats
	w := t.clocks.of(p.key, arrival).Hear(resp, sent, arrival, p.backend.longestHold())
	if !p.scope.holds {
		w.Holds = nil // see Transport.IgnoreHolds
	} else if headers.Refuses(resp) && len(w.Holds) == 0 && resp.Body != nil {
		if release, ok := takeBody(ctx, headers.BodySize); ok {
			body := readStart(resp, release)
			if !body.within(bodyWait) {
				go p.heedLate(ctx, resp, body, sent, repeats)
			} else {
				p.hearBody(&w, resp, body)
			}
		}
	}
	if p.scope.holds && len(p.at.pool) > 1 && len(w.Holds) == 0 {
		w.Holds = rejected(resp.StatusCode) // a Pool's credential the upstream rejects
	}
	repeats.lengthen(p.key, &w, sent, p.backend.longestHold())
	p.backend.heed(ctx, p.key, p.grant, w, p.scope)
}

// bodyWait is how long a Transport waits for the start of a refusal's body
// before it passes the response on: a body that trickles is heard once it
// comes (heedLate), and never holds the status.
const bodyWait = 100 * time.Millisecond

// hearBody adds to w what the start of resp's body, read as body, asks
// for.
func (p pacing) hearBody(w *headers.Word, resp *http.Response, body *startRead) {
	headers.HearBody(w, decoded(body.start, resp.Header.Get("Content-Encoding")), p.backend.longestHold())
	body.held.Store(len(w.Holds) > 0)
}

// heedLate applies the holds that the start of resp's body asks for once it
// has come (or the body failed, or was closed), after the response went on
// without them.
func (p pacing) heedLate(ctx context.Context, resp *http.Response, body *startRead, sent time.Time, repeats *repeatedHolds) {
	<-body.done
	w := headers.Word{Status: resp.StatusCode, At: time.Now()}
	if p.hearBody(&w, resp, body); len(w.Holds) == 0 {
		return
	}
	repeats.lengthen(p.key, &w, sent, p.backend.longestHold())
	p.backend.heed(ctx, p.key, p.grant, w, heedScope{holds: true}) // its holds alone: the refusal was heeded
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
	host, port := req.URL.Hostname(), portOf(req)
	switch {
	case host == "":
		return ""
	case port == "":
		return strings.ToLower(req.URL.Host)
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}

// portOf returns the port req goes to: its URL's, or its scheme's default
// (443 for https and wss, 80 for http and ws), or "" for another scheme
// without a port.
func portOf(req *http.Request) string {
	if port := req.URL.Port(); port != "" {
		return port
	}
	switch strings.ToLower(req.URL.Scheme) {
	case "https", "wss":
		return "443"
	case "http", "ws":
		return "80"
	}
	return ""
}

// isNil says whether l holds a nil pointer (such as the *Redis of a
// NewRedis that failed), or another nil, whose methods would panic.
func isNil(l Limiter) bool {
	if l == nil {
		return false
	}
	switch v := reflect.ValueOf(l); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// readsBody reports whether p's response body says the key's counters,
// which p's limiter is to hear.
func (p pacing) readsBody() bool {
	return p.counters != nil && p.backend != nil && p.scope.counters
}
