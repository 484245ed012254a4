package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/httptoken"
)

// A serveConfig is what pace serve is told, from its flags or its -config
// file (YAML, with the field names below; an unknown field is an error).
type serveConfig struct {
	// Redis is the URL of the Redis the replicas share; empty: an embedded
	// store, which paces this replica alone.
	Redis string `yaml:"redis"`
	// Prefix is the prefix of pace's keys (WithPrefix).
	Prefix string `yaml:"prefix"`
	// Listen is the address of the routes that name none, and of
	// /healthz, /metrics and /pace/v1/wait.
	Listen string `yaml:"listen"`
	// Drain bounds how long a shutdown waits for requests in flight.
	Drain time.Duration `yaml:"drain"`
	// The bounds of what each client may hold of the server.
	bounds `yaml:",inline"`
	Routes []routeConfig `yaml:"routes"`
}

// A routeConfig is one upstream and how its requests are paced.
type routeConfig struct {
	// Name names the route in keys, metrics and the wait endpoint.
	Name string `yaml:"name"`
	// Listen, when set, gives the route an address of its own.
	Listen string `yaml:"listen"`
	// Path is the prefix of the paths the route takes on its address, cut
	// off before the request goes upstream; "/" takes every path.
	Path string `yaml:"path"`
	// Upstream is the URL requests go to: scheme, host and a base path.
	Upstream string `yaml:"upstream"`
	// Limit, or Limits (named limits of an AllOf), in ParseLimit's text.
	Limit  string            `yaml:"limit"`
	Limits map[string]string `yaml:"limits"`
	// InFlight caps the route's requests in flight (0: no cap), each
	// slot a lease of Lease.
	InFlight int           `yaml:"in_flight"`
	Lease    time.Duration `yaml:"lease"`
	// Costs is "openai" or "anthropic": each request's tokens estimated
	// from its body, then settled from its usage.
	Costs string `yaml:"costs"`
	// MaxTokens is the estimate of a response's tokens when the request
	// names no max_tokens.
	MaxTokens int `yaml:"max_tokens"`
	// KeyHeader gives each value of that header a bucket of its own.
	KeyHeader string `yaml:"key_header"`
	// ClassHeader is the request header that names a request's class
	// (critical, default or batch).
	ClassHeader string `yaml:"class_header"`
	// MaxWait bounds a request's wait; past it, the answer is a 429.
	MaxWait time.Duration `yaml:"max_wait"`
	// APIKeyEnv names the environment variable whose value replaces the
	// client's credentials, in APIKeyHeader (default Authorization, as a
	// bearer token).
	APIKeyEnv    string `yaml:"api_key_env"`
	APIKeyHeader string `yaml:"api_key_header"`
	// APIKeysEnv, instead of APIKeyEnv, names several: a pool of
	// credentials (pace.Pool), each with the route's quota of its own;
	// each request goes with the one that can go soonest.
	APIKeysEnv []string `yaml:"api_keys_env"`
	// AffinityHeader, with APIKeysEnv, keeps the requests that carry one
	// value of that header on one credential while it can go at once.
	AffinityHeader string `yaml:"affinity_header"`
	// Shadow makes the route's limiters dry runs (pace.WithDryRun): its
	// requests go at once, and the waits pacing would impose are reported
	// (in the metrics, and the log at debug).
	Shadow bool `yaml:"shadow"`
	// IgnoreHolds, IgnoreCounters and IgnoreRefusals are Transport's.
	IgnoreHolds    bool `yaml:"ignore_holds"`
	IgnoreCounters bool `yaml:"ignore_counters"`
	IgnoreRefusals bool `yaml:"ignore_refusals"`
	// Rules, tried in order before the route's own limit, pace some of
	// its requests otherwise.
	Rules []ruleConfig `yaml:"rules"`
}

// A ruleConfig is a pace.Rule within a route, matched on the request as
// the upstream gets it.
type ruleConfig struct {
	Name      string `yaml:"name"`
	Path      string `yaml:"path"`
	Method    string `yaml:"method"`
	Limit     string `yaml:"limit"`
	Cost      int    `yaml:"cost"`
	KeyHeader string `yaml:"key_header"`
	Unlimited bool   `yaml:"unlimited"`
	// BodyCounters names the counters the upstream states in its bodies,
	// which then steer the rule's keys: "shopify" (pace.ShopifyCounters).
	BodyCounters string `yaml:"body_counters"`
}

// bodyCounters are the readers of counters a rule's body_counters names.
var bodyCounters = map[string]pace.BodyCounters{"shopify": pace.ShopifyCounters}

// Defaults of what a configuration leaves out.
const (
	defaultListen    = "127.0.0.1:8080"
	defaultDrain     = 30 * time.Second
	defaultMaxWait   = 60 * time.Second
	defaultMaxTokens = 4096
	maxConfigSize    = 1 << 20
)

// readConfig reads the YAML file at path, and no more of it than
// maxConfigSize and a byte.
func readConfig(path string) (*serveConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigSize {
		return nil, fmt.Errorf("%s: more than %d bytes", path, maxConfigSize)
	}
	c, err := parseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parseConfig reads a configuration and fills in its defaults.
func parseConfig(data []byte) (*serveConfig, error) {
	var c serveConfig
	decoder := yaml.NewDecoder(bytes.NewReader(data))
	decoder.KnownFields(true)
	if err := decoder.Decode(&c); err != nil {
		return nil, err
	}
	var next yaml.Node
	if err := decoder.Decode(&next); err != io.EOF {
		return nil, errors.New("a second YAML document (after ---): want one")
	}
	c.fill()
	return &c, nil
}

// fill sets the defaults of what c leaves out.
func (c *serveConfig) fill() {
	if c.Listen == "" {
		c.Listen = defaultListen
	}
	if c.Drain == 0 {
		c.Drain = defaultDrain
	}
	c.bounds.fill()
	if c.Prefix == "" {
		c.Prefix = pace.DefaultPrefix
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		if r.Listen == "" {
			r.Listen = c.Listen
		}
		if r.Path == "" {
			r.Path = "/"
		}
		if r.MaxWait == 0 {
			r.MaxWait = defaultMaxWait
		}
		if r.MaxTokens == 0 {
			r.MaxTokens = defaultMaxTokens
		}
		if r.APIKeyHeader == "" {
			r.APIKeyHeader = "Authorization"
		}
	}
}

// check returns what is wrong with c, each error naming its field and
// value, or nil.
func (c *serveConfig) check() error {
	var errs []error
	if c.Drain < 0 {
		errs = append(errs, fmt.Errorf("drain %v: want a positive duration", c.Drain))
	}
	errs = append(errs, c.bounds.check()...)
	if err := checkAddress("listen", c.Listen); err != nil {
		errs = append(errs, err)
	}
	if len(c.Routes) == 0 {
		errs = append(errs, errors.New("routes: want at least one route"))
	}
	seen := map[string]bool{}
	places := map[string]string{} // listen address and path: the route there
	for i, r := range c.Routes {
		field := fmt.Sprintf("routes[%d]", i)
		if r.Name != "" {
			field = fmt.Sprintf("route %q", r.Name)
		}
		if seen[r.Name] && r.Name != "" {
			errs = append(errs, fmt.Errorf("%s: name %q: another route has it", field, r.Name))
		}
		seen[r.Name] = true
		place := r.Listen + " " + r.Path
		if other, ok := places[place]; ok {
			errs = append(errs, fmt.Errorf("%s: listen %s path %q: route %q takes every request there first, so this route can match none", field, r.Listen, r.Path, other))
		}
		places[place] = r.Name
		for _, err := range r.check() {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	return errors.Join(append(errs, c.checkKeyNames()...)...)
}

// checkKeyNames returns an error for each rule whose name is a route's or
// another rule's: a name begins the keys of the requests it paces, so two
// of them would book one bucket, each at its own limit.
func (c *serveConfig) checkKeyNames() []error {
	var errs []error
	owners := map[string]string{}
	for _, r := range c.Routes {
		owners[r.Name] = fmt.Sprintf("route %q", r.Name)
	}
	for _, r := range c.Routes {
		for i, rule := range r.Rules {
			if owner, ok := owners[rule.Name]; ok && rule.Name != "" {
				errs = append(errs, fmt.Errorf("route %q: rules[%d] name %q: %s has it, and a name begins the keys of the requests it paces", r.Name, i, rule.Name, owner))
				continue
			}
			owners[rule.Name] = fmt.Sprintf("route %q's rules[%d]", r.Name, i)
		}
	}
	return errs
}

// keyHeaders returns the headers that key r's requests, by field.
func (r *routeConfig) keyHeaders() map[string]string {
	headers := map[string]string{}
	if r.KeyHeader != "" {
		headers["key_header"] = r.KeyHeader
	}
	for i, rule := range r.Rules {
		if rule.KeyHeader != "" {
			headers[fmt.Sprintf("rules[%d] key_header", i)] = rule.KeyHeader
		}
	}
	return headers
}

// check returns what is wrong with r.
func (r *routeConfig) check() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Name == "" || strings.ContainsAny(r.Name, "|{}/ \t\r\n") {
		add("name %q: want a name without spaces, bars, braces or slashes", r.Name)
	}
	if err := checkAddress("listen", r.Listen); err != nil {
		errs = append(errs, err)
	}
	if resolved, err := resolvePath(r.Path); err != nil || resolved != r.Path || strings.ContainsAny(r.Path, "?#{}% \t") ||
		r.Path == "/pace/" || strings.HasPrefix(r.Path, "/pace/v1/") || r.Path == "/healthz" || r.Path == "/metrics" {
		add("path %q: want a resolved path from its slash (no dot segments, doubled slashes, spaces, braces, escapes, query), outside /pace/v1/, /healthz and /metrics", r.Path)
	} else if !strings.HasSuffix(r.Path, "/") {
		add("path %q: want a prefix that ends in a slash (%s/)", r.Path, r.Path)
	}
	if err := checkUpstream(r.Upstream); err != nil {
		errs = append(errs, err)
	}
	if (r.Limit == "") == (len(r.Limits) == 0) {
		add("limit %q, limits %v: want one of them", r.Limit, r.Limits)
	}
	if r.InFlight < 0 {
		add("in_flight %d: want 0 (no cap) or more", r.InFlight)
	}
	if r.Lease != 0 && (r.Lease < 30*time.Millisecond || r.Lease > time.Hour) {
		add("lease %v: want 30ms to 1h", r.Lease)
	}
	if r.MaxWait < 0 {
		add("max_wait %v: want a positive duration", r.MaxWait)
	}
	if r.MaxTokens < 0 {
		add("max_tokens %d: want a positive count", r.MaxTokens)
	}
	if _, known := costDialects[r.Costs]; r.Costs != "" && !known {
		add("costs %q: want %s or nothing", r.Costs, strings.Join(slices.Sorted(maps.Keys(costDialects)), ", "))
	}
	for field, header := range map[string]string{"class_header": r.ClassHeader, "api_key_header": r.APIKeyHeader, "key_header": r.KeyHeader, "affinity_header": r.AffinityHeader} {
		if header != "" && !httptoken.Valid(header) {
			add("%s %q: not a header name", field, header)
		}
	}
	for field, header := range r.keyHeaders() {
		if strings.HasPrefix(http.CanonicalHeaderKey(header), "X-Pace-") {
			add("%s %q: pace serve's own headers never reach the rules that key requests; name another", field, header)
		}
	}
	if r.APIKeyEnv != "" && os.Getenv(r.APIKeyEnv) == "" {
		add("api_key_env %q: that variable is empty or unset", r.APIKeyEnv)
	}
	for _, mistake := range r.checkPool() {
		add("%s", mistake)
	}
	if (r.Limit == "") != (len(r.Limits) == 0) {
		if _, err := routeQuota(*r); err != nil {
			errs = append(errs, err)
		}
	}
	return append(errs, r.checkRules()...)
}

// checkPool returns what is wrong with r's pool of credentials
// (api_keys_env), each naming its field.
func (r *routeConfig) checkPool() []string {
	var mistakes []string
	switch {
	case r.APIKeysEnv == nil:
		if r.AffinityHeader != "" {
			mistakes = append(mistakes, fmt.Sprintf("affinity_header %q: without api_keys_env, no credential to keep requests on", r.AffinityHeader))
		}
		return mistakes
	case r.APIKeyEnv != "":
		mistakes = append(mistakes, fmt.Sprintf("api_keys_env with api_key_env %q: name one key, or a pool", r.APIKeyEnv))
	case len(r.APIKeysEnv) == 0:
		mistakes = append(mistakes, "api_keys_env: want one variable at least")
	case r.InFlight > 0:
		mistakes = append(mistakes, fmt.Sprintf("api_keys_env with in_flight %d: a pool's credentials cannot share a cap in flight", r.InFlight))
	}
	for _, name := range r.APIKeysEnv {
		if os.Getenv(name) == "" {
			mistakes = append(mistakes, fmt.Sprintf("api_keys_env %q: that variable is empty or unset", name))
		}
	}
	if err := r.pool().Check(); len(mistakes) == 0 && err != nil {
		mistakes = append(mistakes, "api_keys_env: "+err.Error())
	}
	return mistakes
}

// pool is the pool of credentials r names (api_keys_env), each named as
// its variable: nil for none.
func (r *routeConfig) pool() *pace.Pool {
	if r.APIKeysEnv == nil {
		return nil
	}
	pool := &pace.Pool{Header: r.APIKeyHeader, Affinity: r.AffinityHeader}
	for _, name := range r.APIKeysEnv {
		pool.Credentials = append(pool.Credentials, pace.Credential{Name: name, Secret: os.Getenv(name)})
	}
	return pool
}

// checkRules returns what is wrong with r's rules: a limit ParseLimit
// refuses, or a rule that no request can reach.
func (r *routeConfig) checkRules() []error {
	var errs []error
	var upstream url.URL
	if u, err := url.Parse(r.Upstream); err == nil {
		upstream = *u
	}
	base := strings.TrimSuffix(upstream.Path, "/")
	for i, rule := range r.Rules {
		field := fmt.Sprintf("rules[%d] %q", i, rule.Name)
		if rule.Path == "" && rule.Method == "" {
			errs = append(errs, fmt.Errorf("%s: no path and no method: it takes every request, and the route's limit and the rules after it can match none", field))
		}
		if rule.Path != "" && !strings.HasPrefix(rule.Path, base) {
			errs = append(errs, fmt.Errorf("%s: path %q: outside the upstream's path %q, it can match no request", field, rule.Path, upstream.Path))
		}
		if !rule.Unlimited {
			if _, err := pace.ParseLimit(rule.Limit); err != nil {
				errs = append(errs, fmt.Errorf("%s: limit: %w", field, err))
			}
		}
		if _, known := bodyCounters[rule.BodyCounters]; rule.BodyCounters != "" && (!known || rule.Unlimited) {
			errs = append(errs, fmt.Errorf("%s: body_counters %q: want shopify, on a rule with a limit", field, rule.BodyCounters))
		}
	}
	return errs
}

// checkAddress checks a listen address, HOST:PORT.
func checkAddress(field, addr string) error {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%s %q: want HOST:PORT", field, addr)
	}
	return nil
}

// checkUpstream checks an upstream's URL.
func checkUpstream(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("upstream %q: %w", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("upstream %q: want an http or https URL", raw)
	case u.Host == "":
		return fmt.Errorf("upstream %q: want a host", raw)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("upstream %q: want no query, fragment or user", raw)
	}
	return nil
}
