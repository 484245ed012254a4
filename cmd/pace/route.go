package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
)

// A route proxies the requests of one path prefix to one upstream, each
// paced by pace's Transport: its limit, or the first of its rules that
// matches. It is safe for concurrent use.
type route struct {
	config   routeConfig
	limiter  *pace.Redis // the route's own limit
	limiters []*pace.Redis
	ruled    map[string]*pace.Redis // the limiters of its rules that limit, by name
	bursts   map[string]int         // of the route's named limits
	key      string                 // the key of the requests its own limit paces, without KeyHeader
	upstream *url.URL
	proxy    *httputil.ReverseProxy
	apiKey   string     // what replaces the client's credentials, or ""
	pool     *pace.Pool // the credentials one of which replaces them, or nil
	buffer   *buffer    // the server's budget of bytes held for estimates
	stopping context.Context
	closed   sync.Once
}

// A store is what the routes of a server book on: a Redis client, and the
// options every limiter takes.
type store struct {
	client  redis.Scripter
	options []pace.Option
}

// newRoute builds c's route on st, sending to base; a request that waits
// when stopping ends gives its tokens back and is answered 503. Its
// estimates hold bytes of buf.
func newRoute(c routeConfig, st store, base http.RoundTripper, stopping context.Context, buf *buffer) (*route, error) {
	rt := &route{config: c, stopping: stopping, buffer: buf}
	rt.upstream, _ = url.Parse(c.Upstream) // checked
	rt.key = c.Name + "|" + pace.HostKey(&http.Request{URL: rt.upstream})
	if c.APIKeyEnv != "" {
		rt.apiKey = apiKeyValue(c.APIKeyHeader, os.Getenv(c.APIKeyEnv))
	}
	rt.pool = c.pool()
	transport, err := rt.transport(st, base)
	if err != nil {
		rt.close()
		return nil, err
	}
	rt.proxy = &httputil.ReverseProxy{
		Rewrite:       rt.rewrite,
		Transport:     transport,
		FlushInterval: -1, // each write of a stream reaches the client as it comes
		ErrorHandler:  rt.refuse,
	}
	return rt, nil
}

// transport returns the pace Transport of the route's requests, with a
// limiter for its limit and one for each of its rules.
func (rt *route) transport(st store, base http.RoundTripper) (*pace.Transport, error) {
	c := rt.config
	quota, err := routeQuota(c)
	if err != nil {
		return nil, err
	}
	rt.bursts = map[string]int{}
	for name, text := range c.Limits {
		limit, _ := pace.ParseLimit(text) // read by routeQuota
		rt.bursts[name] = limit.Burst()
	}
	if rt.limiter, err = rt.newLimiter(st, quota, "limit"); err != nil {
		return nil, err
	}
	own := pace.Rule{Name: c.Name, Limiter: rt.limiter, KeyHeader: c.KeyHeader}
	if c.Costs != "" {
		own.Estimate, own.Settle = estimated, settler(c)
	}
	rules, err := rt.rules(st)
	if err != nil {
		return nil, err
	}
	all, err := pace.NewRules(own, rules...)
	if err != nil {
		return nil, err
	}
	return &pace.Transport{
		Base:           upstreamTransport{base},
		Rules:          all,
		IgnoreHolds:    c.IgnoreHolds,
		IgnoreCounters: c.IgnoreCounters,
		IgnoreRefusals: c.IgnoreRefusals,
		Pool:           rt.pool,
	}, nil
}

// rules returns the route's rules (checked: see routeConfig.checkRules),
// each with a limiter of its own.
func (rt *route) rules(st store) ([]pace.Rule, error) {
	var rules []pace.Rule
	rt.ruled = map[string]*pace.Redis{}
	for i, r := range rt.config.Rules {
		field := fmt.Sprintf("rules[%d] %q", i, r.Name)
		rule := pace.Rule{Name: r.Name, PathPrefix: r.Path, Method: r.Method, Cost: r.Cost, KeyHeader: r.KeyHeader, Unlimited: r.Unlimited,
			BodyCounters: bodyCounters[r.BodyCounters]}
		if !r.Unlimited {
			limit, _ := pace.ParseLimit(r.Limit) // checked
			limiter, err := rt.newLimiter(st, limit, field)
			if err != nil {
				return nil, err
			}
			rule.Limiter, rt.ruled[r.Name] = limiter, limiter
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// newLimiter returns a limiter of quota on st, kept for close.
func (rt *route) newLimiter(st store, quota pace.Quota, field string) (*pace.Redis, error) {
	options := append(slices.Clip(st.options), pace.WithMaxWait(rt.config.MaxWait))
	if rt.config.Shadow {
		options = append(options, pace.WithDryRun())
	}
	if rt.config.Lease != 0 {
		options = append(options, pace.WithLease(rt.config.Lease))
	}
	limiter, err := pace.NewRedis(st.client, quota, options...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	rt.limiters = append(rt.limiters, limiter)
	return limiter, nil
}

// announce tells the fleet the limits of the keys of the route it knows
// (its own, and its rules'; not those of a key header's values), so that
// a limit a reload lowered holds from now on, and the requests booked at
// the old one book anew (see pace.Redis.Announce).
func (rt *route) announce(ctx context.Context) error {
	host := pace.HostKey(&http.Request{URL: rt.upstream})
	errs := []error{rt.limiter.Announce(ctx, rt.key)}
	for name, limiter := range rt.ruled {
		errs = append(errs, limiter.Announce(ctx, name+"|"+host))
	}
	return errors.Join(errs...)
}

// close closes the route's limiters, once.
func (rt *route) close() {
	rt.closed.Do(func() {
		for _, l := range rt.limiters {
			l.Close()
		}
	})
}

// routeQuota returns the quota c says: its limit, or its named limits,
// with its cap in flight.
func routeQuota(c routeConfig) (pace.Quota, error) {
	var quota []pace.Limit
	if c.Limit != "" {
		limit, err := pace.ParseLimit(c.Limit)
		if err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
		quota = append(quota, limit)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Limits)) {
		limit, err := pace.ParseLimit(c.Limits[name])
		if err != nil {
			return nil, fmt.Errorf("limits.%s: %w", name, err)
		}
		quota = append(quota, limit.Named(name))
	}
	if c.InFlight > 0 {
		quota = append(quota, pace.Concurrent(c.InFlight).Named("in_flight"))
	}
	if err := checkCostLimits(c, quota); err != nil {
		return nil, err
	}
	if len(quota) == 1 {
		return quota[0], nil
	}
	return pace.AllOf(quota...), nil
}

// rewrite builds the upstream's request: the route's path prefix cut off,
// the upstream's URL joined on, pace's own headers dropped and, with an
// API key of the route's, the client's credentials replaced (with a pool,
// its Transport puts the one chosen on after its wait). The client's
// Accept-Encoding is dropped too: Go's transport then asks for gzip and
// decodes it, so that pace reads every body (a refusal's hold, a
// settlement's usage) whatever the client accepts, and the client gets it
// as it is.
func (rt *route) rewrite(pr *httputil.ProxyRequest) {
	prefix := strings.TrimSuffix(rt.config.Path, "/")
	pr.Out.URL.Path = strings.TrimPrefix(pr.Out.URL.Path, prefix)
	if pr.Out.URL.RawPath != "" {
		pr.Out.URL.RawPath = strings.TrimPrefix(pr.Out.URL.RawPath, prefix)
	}
	pr.SetURL(rt.upstream)
	for name := range pr.Out.Header {
		if strings.HasPrefix(name, "X-Pace-") || name == "Accept-Encoding" {
			pr.Out.Header.Del(name)
		}
	}
	if rt.apiKey != "" || rt.pool != nil {
		for _, name := range []string{"Authorization", "X-Api-Key", rt.config.APIKeyHeader} {
			pr.Out.Header.Del(name)
		}
	}
	if rt.apiKey != "" {
		pr.Out.Header.Set(rt.config.APIKeyHeader, rt.apiKey)
	}
}

// apiKeyValue returns what header carries for key: a bearer token in
// Authorization, the key itself elsewhere (Anthropic's x-api-key).
func apiKeyValue(header, key string) string {
	if http.CanonicalHeaderKey(header) == "Authorization" {
		return "Bearer " + key
	}
	return key
}

// upstreamTransport sends a request with its client's context, not the
// one it waited with: the wait's deadline and the server's shutdown end
// waits, never a request on its way.
type upstreamTransport struct{ base http.RoundTripper }

// An upstreamKey is the context key of the client's own context.
type upstreamKey struct{}

// RoundTrip implements http.RoundTripper.
func (u upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if ctx, ok := req.Context().Value(upstreamKey{}).(context.Context); ok {
		req = req.WithContext(ctx)
	}
	return u.base.RoundTrip(req)
}

// errShuttingDown is why the waits of a server that stops end.
var errShuttingDown = errors.New("pace serve: shutting down")
