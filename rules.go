package pace

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// A Rule says which requests it takes, and by which limiter, under which
// key and at which cost they are paced. Rules are tried in order; the first
// that matches a request decides it.
type Rule struct {
	// Name names the rule in keys and errors. Required, and unique.
	Name string

	// What the rule matches; an empty field matches every request.
	//
	// Host is the URL's host, compared case-insensitively, such as
	// "api.github.com"; with a port ("localhost:8080", "[::1]:8443") it
	// matches that port alone, the scheme's default port included
	// ("api.github.com:443" matches https://api.github.com/). No scheme,
	// path or user.
	Host string
	// PathPrefix is the start of the URL's path, from its slash, such as
	// "/v1/"; no query.
	PathPrefix string
	// Method is the request's method, compared case-insensitively, such as
	// "POST".
	Method string

	// Key begins the keys of the rule's requests; the default is Name. A
	// request's key is Key, a bar and the request's HostKey, such as
	// "core|api.github.com:443", then, with KeyHeader, a bar and the hash
	// of that header's value. Rules with the same Key share the buckets of
	// the limits they share (see Limit.Named) on each host.
	Key string

	// KeyHeader, when set, gives each value of that request header (an API
	// token, a tenant id) a bucket of its own. The value is hashed
	// (SHA-256) before it becomes part of a key: a token never reaches Redis
	// in clear. Requests without the header share one bucket.
	KeyHeader string

	// Limiter paces the rule's requests; Unlimited lets them through. A rule
	// says one or the other.
	Limiter   Limiter
	Unlimited bool

	// Cost is what each request takes; 0 means 1. CostHeader, when set,
	// takes the cost from that request header instead (a whole number of 1
	// or more; 1 when the header is absent).
	Cost       int
	CostHeader string

	// Estimate and Settle, when set, estimate each request's costs under
	// each limit and settle them from its response, as Transport's fields
	// of the same names do; the Limiter must then be Local or Redis.
	Estimate func(*http.Request) Costs
	Settle   Settler

	// BodyCounters, when set, reads the counters the upstream states in
	// the rule's response bodies, as Transport.BodyCounters does; the
	// Limiter must then be Local or Redis.
	BodyCounters BodyCounters

	// Class is the priority class of the rule's requests (see Class),
	// unless a request's context carries one (WithClass).
	Class Class

	// IgnoreRefusals keeps the refusals of the rule's requests from
	// cutting its keys' rates, as Transport.IgnoreRefusals does for all.
	IgnoreRefusals bool

	// IgnoreHolds keeps the rule's responses from holding its keys, as
	// Transport.IgnoreHolds does for all.
	IgnoreHolds bool
}

// Rules map each request to a limiter, a key and a cost, by the first Rule
// that matches it, or Default. Build them with NewRules; set them as a
// Transport's Rules.
type Rules struct {
	rules    []Rule
	matchers []matcher // each rule's match fields, checked
}

// NewRules checks rules and returns them, with def last: the rule for
// requests that no other rule matches (its match fields must be empty). Every
// error names the rule, the field and the value.
func NewRules(def Rule, rules ...Rule) (*Rules, error) {
	if def.Host != "" || def.PathPrefix != "" || def.Method != "" {
		return nil, fmt.Errorf("pace: default rule %q: it matches every request and may not name a host, path or method", def.Name)
	}
	all := append(append([]Rule(nil), rules...), def)
	rs := &Rules{rules: all, matchers: make([]matcher, len(all))}
	names := make(map[string]bool)
	for i, r := range all {
		if names[r.Name] {
			return nil, fmt.Errorf("pace: two rules named %q", r.Name)
		}
		names[r.Name] = true
		m, err := newMatcher(r)
		if err == nil {
			err = checkRule(r)
		}
		if err != nil {
			return nil, err
		}
		rs.matchers[i] = m
	}
	return rs, nil
}

// checkRule reports what is wrong with a rule's name, limiter, costs and
// headers.
func checkRule(r Rule) error {
	switch {
	case r.Name == "":
		return errors.New("pace: a rule without a name")
	case r.Limiter == nil && !r.Unlimited:
		return fmt.Errorf("pace: rule %q has no limit: set Limiter, or Unlimited to let its requests through", r.Name)
	case isNil(r.Limiter):
		return fmt.Errorf("pace: rule %q: its Limiter is a nil %T (did the constructor that made it fail?)", r.Name, r.Limiter)
	case r.Limiter != nil && r.Unlimited:
		return fmt.Errorf("pace: rule %q has a Limiter and is Unlimited: say one or the other", r.Name)
	case r.Cost < 0:
		return fmt.Errorf("pace: rule %q: cost %d is below 0", r.Name, r.Cost)
	case r.Settle != nil && r.Estimate == nil:
		return fmt.Errorf("pace: rule %q has a Settle without an Estimate: nothing would be reserved to settle", r.Name)
	case !validHeaderName(r.KeyHeader):
		return fmt.Errorf("pace: rule %q: KeyHeader %q is not a header name", r.Name, r.KeyHeader)
	case !validHeaderName(r.CostHeader):
		return fmt.Errorf("pace: rule %q: CostHeader %q is not a header name", r.Name, r.CostHeader)
	}
	p, ours := backendOf(r.Limiter)
	if r.Estimate != nil && !ours {
		return fmt.Errorf("pace: rule %q has an Estimate, and its Limiter is not one that reserves, Local or Redis: a %s", r.Name, limiterType(r.Limiter))
	}
	if r.BodyCounters != nil && !ours {
		return fmt.Errorf("pace: rule %q has BodyCounters, and its Limiter is not one they steer, Local or Redis: a %s", r.Name, limiterType(r.Limiter))
	}
	if ours && r.Cost > p.MaxCost() {
		return fmt.Errorf("pace: rule %q: cost %d exceeds the burst %d of its limiter", r.Name, r.Cost, p.MaxCost())
	}
	return nil
}

// decide returns the rule that takes req, and the request's key and cost
// under it.
func (rs *Rules) decide(req *http.Request) (*Rule, string, int, error) {
	r := rs.match(req)
	key := cmp.Or(r.Key, r.Name) + "|" + HostKey(req)
	if r.KeyHeader != "" {
		if v := req.Header.Get(r.KeyHeader); v != "" {
			sum := sha256.Sum256([]byte(v))
			key += "|" + hex.EncodeToString(sum[:16])
		}
	}
	cost := max(r.Cost, 1)
	if r.CostHeader != "" {
		if v := req.Header.Get(r.CostHeader); v != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return r, key, 0, fmt.Errorf("pace: rule %q: header %s: %q is not a cost of 1 or more", r.Name, r.CostHeader, v)
			}
			cost = n
		}
	}
	return r, key, cost, nil
}

func (rs *Rules) match(req *http.Request) *Rule {
	path := upstreamPath(req.URL.Path) // once, for every rule
	for i := range rs.matchers[:len(rs.matchers)-1] {
		if rs.matchers[i].matches(req, path) {
			return &rs.rules[i]
		}
	}
	return &rs.rules[len(rs.rules)-1] // the default matches everything
}
