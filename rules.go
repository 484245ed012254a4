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
	Host       string // the URL's host, without port, compared case-insensitively
	PathPrefix string // the start of the URL's path
	Method     string // such as "POST"

	// Key names the rule's buckets; rules with the same Key share the
	// buckets of the limits they share (see Limit.Named). The default is
	// Name.
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
	// of the same names do; the Limiter must then be a Reserver.
	Estimate func(*http.Request) Costs
	Settle   Settler

	// Class is the priority class of the rule's requests (see Class),
	// unless a request's context carries one (WithClass).
	Class Class

	// IgnoreRefusals keeps the refusals of the rule's requests from
	// cutting its keys' rates, as Transport.IgnoreRefusals does for all.
	IgnoreRefusals bool
}

// Rules map each request to a limiter, a key and a cost, by the first Rule
// that matches it, or Default. Build them with NewRules; set them as a
// Transport's Rules.
type Rules struct {
	rules []Rule
}

// A CostBounder is a Limiter that knows the largest cost it can ever grant
// one wait: Local and Redis are. NewRules refuses a Rule whose Cost is
// larger (a decorator that forwards MaxCost gets the same check).
type CostBounder interface {
	Limiter
	// MaxCost returns the largest cost a wait can be granted: the smallest
	// burst, or window count, of the quota's limits.
	MaxCost() int
}

// MaxCost implements CostBounder.
func (loc *Local) MaxCost() int { return loc.costCap }

// MaxCost implements CostBounder.
func (r *Redis) MaxCost() int { return r.costCap }

// NewRules checks rules and returns them, with def last: the rule for
// requests that no other rule matches (its match fields must be empty). Every
// error names the rule and the value.
func NewRules(def Rule, rules ...Rule) (*Rules, error) {
	if def.Host != "" || def.PathPrefix != "" || def.Method != "" {
		return nil, fmt.Errorf("pace: default rule %q: it matches every request and may not name a host, path or method", def.Name)
	}
	all := append(append([]Rule(nil), rules...), def)
	names := make(map[string]bool)
	for _, r := range all {
		switch {
		case r.Name == "":
			return nil, errors.New("pace: a rule without a name")
		case names[r.Name]:
			return nil, fmt.Errorf("pace: two rules named %q", r.Name)
		case r.Limiter == nil && !r.Unlimited:
			return nil, fmt.Errorf("pace: rule %q has no limit: set Limiter, or Unlimited to let its requests through", r.Name)
		case r.Limiter != nil && r.Unlimited:
			return nil, fmt.Errorf("pace: rule %q has a Limiter and is Unlimited: say one or the other", r.Name)
		case r.Cost < 0:
			return nil, fmt.Errorf("pace: rule %q: cost %d is below 0", r.Name, r.Cost)
		case r.Settle != nil && r.Estimate == nil:
			return nil, fmt.Errorf("pace: rule %q has a Settle without an Estimate: nothing would be reserved to settle", r.Name)
		}
		if _, ok := r.Limiter.(Reserver); r.Estimate != nil && !ok {
			return nil, fmt.Errorf("pace: rule %q has an Estimate, and its Limiter (a %T) is not a Reserver", r.Name, r.Limiter)
		}
		if m, ok := r.Limiter.(CostBounder); ok && r.Cost > m.MaxCost() {
			return nil, fmt.Errorf("pace: rule %q: cost %d exceeds the burst %d of its limiter", r.Name, r.Cost, m.MaxCost())
		}
		names[r.Name] = true
	}
	return &Rules{rules: all}, nil
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
	for i := range rs.rules {
		r := &rs.rules[i]
		if (r.Host == "" || strings.EqualFold(r.Host, req.URL.Hostname())) &&
			(r.PathPrefix == "" || strings.HasPrefix(req.URL.Path, r.PathPrefix)) &&
			(r.Method == "" || r.Method == req.Method) {
			return r
		}
	}
	return &rs.rules[len(rs.rules)-1] // the default matches everything
}
