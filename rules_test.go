package pace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// recorder is a Limiter that notes every wait.
type recorder struct {
	name  string
	mu    *sync.Mutex
	waits *[]string
}

func (r recorder) Wait(ctx context.Context, key string, cost int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.waits = append(*r.waits, r.name+" "+key+" "+strings.Repeat("*", cost))
	return nil
}

// TestRulesRoute: each request goes to the first rule that matches it, with
// a key by host and hashed header, and a cost from the rule or a header.
func TestRulesRoute(t *testing.T) {
	var mu sync.Mutex
	var waits []string
	lim := func(name string) Limiter { return recorder{name, &mu, &waits} }
	rules, err := NewRules(Rule{Name: "other", Unlimited: true},
		Rule{Name: "search", Host: "api.github.com", PathPrefix: "/search/", KeyHeader: "Authorization", Limiter: lim("search")},
		Rule{Name: "graphql", Host: "api.github.com", PathPrefix: "/graphql", Method: "POST", KeyHeader: "Authorization", CostHeader: "X-Query-Cost", Limiter: lim("graphql")},
		Rule{Name: "core", Host: "API.GitHub.com", KeyHeader: "Authorization", Limiter: lim("core")},
	)
	if err != nil {
		t.Fatal(err)
	}
	tr := &Transport{Base: &countingBase{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}, Rules: rules}
	send := func(method, url, token, cost string) error {
		req, _ := http.NewRequest(method, url, nil)
		if token != "" {
			req.Header.Set("Authorization", token)
		}
		if cost != "" {
			req.Header.Set("X-Query-Cost", cost)
		}
		_, err := tr.RoundTrip(req)
		return err
	}
	for _, r := range []struct{ method, url, token, cost string }{
		{"GET", "https://api.github.com/search/code?q=x", "token ghp_alice", ""},
		{"GET", "https://api.github.com/repos/a/b", "token ghp_alice", ""},
		{"GET", "https://api.github.com/repos/a/b", "token ghp_bob", ""},
		{"POST", "https://api.github.com/graphql", "token ghp_alice", "3"},
		{"GET", "https://api.github.com/graphql", "", ""}, // not a POST: core, no token
		{"GET", "https://example.com/", "token ghp_alice", ""},
	} {
		if err := send(r.method, r.url, r.token, r.cost); err != nil {
			t.Fatal(err)
		}
	}
	hash := func(token string) string {
		sum := sha256.Sum256([]byte(token))
		return hex.EncodeToString(sum[:16])
	}
	alice, bob := hash("token ghp_alice"), hash("token ghp_bob")
	want := []string{
		"search search|api.github.com:443|" + alice + " *",
		"core core|api.github.com:443|" + alice + " *",
		"core core|api.github.com:443|" + bob + " *",
		"graphql graphql|api.github.com:443|" + alice + " ***",
		"core core|api.github.com:443 *",
	}
	if len(waits) != len(want) {
		t.Fatalf("waits %q, want %d of them (example.com unlimited)", waits, len(want))
	}
	for i, w := range waits {
		if strings.Contains(w, "ghp_") {
			t.Errorf("wait %q carries the token in clear", w)
		}
		if w != want[i] {
			t.Errorf("wait %d = %q, want %q", i, w, want[i])
		}
	}

	body := &trackedBody{Reader: strings.NewReader("{}")}
	req, _ := http.NewRequest("POST", "https://api.github.com/graphql", body)
	req.Header.Set("X-Query-Cost", "lots")
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), `"lots"`) || body.closes.Load() != 1 {
		t.Errorf("a bad cost header: %v, body closed %d times; want an error quoting it and the body closed", err, body.closes.Load())
	}
}

// TestRulesBadInput: every rule that cannot work is refused at construction,
// by name and value.
func TestRulesBadInput(t *testing.T) {
	lim := mustLocal(t, PerSecond(10))
	for name, tc := range map[string]struct {
		def   Rule
		rules []Rule
		want  string
	}{
		"no limit":       {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: "api.example.com"}}, `rule "api" has no limit`},
		"both":           {Rule{Name: "default", Limiter: lim, Unlimited: true}, nil, `rule "default" has a Limiter and is Unlimited`},
		"no name":        {Rule{Name: "default", Unlimited: true}, []Rule{{Limiter: lim}}, "without a name"},
		"same name":      {Rule{Name: "api", Unlimited: true}, []Rule{{Name: "api", Limiter: lim}}, `two rules named "api"`},
		"cost > burst":   {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "big", Limiter: lim, Cost: 11}}, `rule "big": cost 11 exceeds the burst 10`},
		"negative cost":  {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "neg", Limiter: lim, Cost: -1}}, `rule "neg": cost -1`},
		"default's host": {Rule{Name: "default", Host: "x", Unlimited: true}, nil, `default rule "default"`},
		"scheme":         {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: "http://127.0.0.1", Limiter: lim}}, `rule "api": Host "http://127.0.0.1" has a scheme`},
		"host and path":  {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: "api.example.com/v1", Limiter: lim}}, `rule "api": Host "api.example.com/v1" is not a host`},
		"port 0":         {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: "localhost:0", Limiter: lim}}, `rule "api": Host "localhost:0" has port "0"`},
		"port text":      {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: "localhost:http", Limiter: lim}}, `rule "api": Host "localhost:http" has port "http"`},
		"port alone":     {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: ":8080", Limiter: lim}}, `rule "api": Host ":8080" has no host`},
		"two colons":     {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Host: "a:1:2", Limiter: lim}}, `rule "api": Host "a:1:2" is not a host`},
		"no slash":       {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", PathPrefix: "v1/", Limiter: lim}}, `rule "api": PathPrefix "v1/" does not begin with a slash`},
		"query":          {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", PathPrefix: "/search?q=", Limiter: lim}}, `rule "api": PathPrefix "/search?q=" has a query`},
		"method":         {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Method: "GET ", Limiter: lim}}, `rule "api": Method "GET " is not a method`},
		"key header":     {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", KeyHeader: "Authorization:", Limiter: lim}}, `rule "api": KeyHeader "Authorization:" is not a header name`},
		"cost header":    {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", CostHeader: "X Cost", Limiter: lim}}, `rule "api": CostHeader "X Cost" is not a header name`},
		"nil *Redis":     {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "api", Limiter: (*Redis)(nil)}}, `rule "api": its Limiter is a nil *pace.Redis`},
		"nil *Local":     {Rule{Name: "default", Limiter: (*Local)(nil)}, nil, `rule "default": its Limiter is a nil *pace.Local`},
		"body counters":  {Rule{Name: "default", Unlimited: true}, []Rule{{Name: "shop", Limiter: waitOnly{lim}, BodyCounters: ShopifyCounters}}, `rule "shop" has BodyCounters, and its Limiter is not one they steer, Local or Redis: a pace.waitOnly`},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewRules(tc.def, tc.rules...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewRules: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestRulesMatchWhatTheUserMeant: a host with its port matches that host
// and port (the scheme's default port included), an IPv6 host with or
// without brackets, and methods compare case-insensitively, both the
// rule's and the request's.
func TestRulesMatchWhatTheUserMeant(t *testing.T) {
	var mu sync.Mutex
	var waits []string
	lim := func(name string) Limiter { return recorder{name, &mu, &waits} }
	rules, err := NewRules(Rule{Name: "other", Unlimited: true},
		Rule{Name: "local", Host: "127.0.0.1:39663", Method: "get", Limiter: lim("local")},
		Rule{Name: "tls", Host: "API.example.com:443", Limiter: lim("tls")},
		Rule{Name: "v6", Host: "[::1]:8080", Limiter: lim("v6")},
		Rule{Name: "v6any", Host: "::1", Limiter: lim("v6any")},
		Rule{Name: "v6brackets", Host: "[fe80::1]", Limiter: lim("v6brackets")},
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, url, want string }{
		{"GET", "http://127.0.0.1:39663/x", "local"},
		{"get", "http://127.0.0.1:39663/x", "local"},
		{"POST", "http://127.0.0.1:39663/x", "other"},
		{"GET", "http://127.0.0.1:39664/x", "other"},
		{"GET", "http://127.0.0.1/x", "other"},
		{"GET", "https://api.example.com/v1", "tls"},
		{"GET", "https://api.example.com:443/v1", "tls"},
		{"GET", "http://api.example.com/v1", "other"},
		{"GET", "http://[::1]:8080/", "v6"},
		{"GET", "http://[::1]:9090/", "v6any"},
		{"GET", "http://[fe80::1]/", "v6brackets"},
	} {
		req, _ := http.NewRequest(tc.method, tc.url, nil)
		if got := rules.match(req).Name; got != tc.want {
			t.Errorf("%s %s: rule %q, want %q", tc.method, tc.url, got, tc.want)
		}
	}
}

// TestRulesMatchThePathTheUpstreamReads: a rule's PathPrefix matches the
// endpoint the request reaches however its path is spelled: an encoded
// slash, empty and dot segments, which upstreams collapse and resolve.
func TestRulesMatchThePathTheUpstreamReads(t *testing.T) {
	var mu sync.Mutex
	var waits []string
	rules, err := NewRules(Rule{Name: "other", Unlimited: true},
		Rule{Name: "search", PathPrefix: "/v1/search", Limiter: recorder{"search", &mu, &waits}},
		Rule{Name: "dir", PathPrefix: "/v1/files/", Limiter: recorder{"dir", &mu, &waits}},
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/v1/search/q6", "search"},
		{"/v1/%2Fsearch/q6", "search"},
		{"/v1/%2fsearch/q6", "search"},
		{"/v1//search/q6", "search"},
		{"//v1/search", "search"},
		{"/v1/x/../search/q6", "search"},
		{"/v1/x/%2E%2E/search/q6", "search"},
		{"/v1/./search", "search"},
		{"/v1/files/", "dir"},
		{"/v1//files//a", "dir"},
		{"/v1/files", "other"},
		{"/v1/searchx/../other", "other"},
		{"/v1/other", "other"},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://api.example.com"+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := rules.match(req).Name; got != tc.want {
			t.Errorf("%s: rule %q, want %q", tc.path, got, tc.want)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, "http://api.example.com/v1/search/q6", nil)
	if n := testing.AllocsPerRun(100, func() { rules.match(req) }); n != 0 {
		t.Errorf("matching a clean path allocates %v times, want none: every request is matched", n)
	}
}

// TestTransportNilLimiter: a Transport whose Limiter is a nil *Redis (a
// NewRedis that failed, its error dropped) fails each request with an
// error that says so, instead of panicking.
func TestTransportNilLimiter(t *testing.T) {
	var lim *Redis
	tr := &Transport{Base: &countingBase{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}, Limiter: lim}
	req, _ := http.NewRequest("GET", "http://example.com/", nil)
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "Transport.Limiter is a nil *pace.Redis") {
		t.Fatalf("RoundTrip: %v, want an error naming the nil *pace.Redis", err)
	}
}

// TestRulesOnRedis: rules keyed by API token on a real Redis and on a real
// cluster: each token has its own bucket, in whatever slot its key hashes
// to, and no token appears in any Redis key.
func TestRulesOnRedis(t *testing.T) {
	besideOthers(t)
	single := redistest.Start(t).Client(t)
	cluster := redistest.StartCluster(t).Client(t)
	for name, c := range map[string]redis.UniversalClient{"single": single, "cluster": cluster} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rules, err := NewRules(Rule{Name: "default", Unlimited: true},
				Rule{Name: "core", Host: "api.github.com", KeyHeader: "Authorization", Limiter: mustRedis(t, c, PerHour(5000))})
			if err != nil {
				t.Fatal(err)
			}
			tr := &Transport{Base: &countingBase{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}, Rules: rules}
			slots := map[int64]bool{}
			for i := range 8 {
				token := "token ghp_secret" + strings.Repeat("x", i)
				req, _ := http.NewRequest("GET", "https://api.github.com/user", nil)
				req.Header.Set("Authorization", token)
				if _, err := tr.RoundTrip(req); err != nil {
					t.Fatalf("token %d: %v", i, err)
				}
				_, key, _, _ := rules.decide(req)
				slots[c.ClusterKeySlot(ctx, DefaultPrefix+"{"+key+"}").Val()] = true
			}
			var keys []string
			scan := func(ctx context.Context, node *redis.Client) error {
				found, err := node.Keys(ctx, "*").Result()
				keys = append(keys, found...)
				return err
			}
			if cc, ok := c.(*redis.ClusterClient); ok {
				var mu sync.Mutex
				err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
					mu.Lock()
					defer mu.Unlock()
					return scan(ctx, node)
				})
			} else {
				err = scan(ctx, c.(*redis.Client))
			}
			if err != nil {
				t.Fatal(err)
			}
			buckets := 0
			for _, k := range keys {
				if strings.Contains(k, "secret") {
					t.Errorf("Redis key %q carries the token", k)
				}
				if strings.HasPrefix(k, DefaultPrefix+"{core|") && !strings.Contains(k, "#") { // beside them, what pace keeps of each (#limits)
					buckets++
				}
			}
			if buckets != 8 || (name == "cluster" && len(slots) < 2) {
				t.Errorf("%d buckets over %d slots for 8 tokens, want 8 buckets (keys %q)", buckets, len(slots), keys)
			}
		})
	}
}

// TestRulesShareNamedLimits: Stripe-style, 4/s for the account and 10/s for
// each endpoint: rules with one Key share the account's limit, and each
// endpoint keeps its own.
func TestRulesShareNamedLimits(t *testing.T) {
	c := newTestRedis(t)
	account := PerSecond(4).Named("account")
	rules, err := NewRules(Rule{Name: "default", Unlimited: true},
		Rule{Name: "charges", Key: "stripe", PathPrefix: "/v1/charges", KeyHeader: "Authorization",
			Limiter: mustRedis(t, c, AllOf(account, PerSecond(10).Named("charges")))},
		Rule{Name: "refunds", Key: "stripe", PathPrefix: "/v1/refunds", KeyHeader: "Authorization",
			Limiter: mustRedis(t, c, AllOf(account, PerSecond(10).Named("refunds")))},
	)
	if err != nil {
		t.Fatal(err)
	}
	tr := &Transport{Base: &countingBase{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}, Rules: rules}
	send := func(path string, deadline time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", "https://api.stripe.com"+path, nil)
		req.Header.Set("Authorization", "Bearer sk_test_123")
		_, err := tr.RoundTrip(req)
		return err
	}
	for _, path := range []string{"/v1/charges", "/v1/charges", "/v1/refunds", "/v1/refunds"} {
		if err := send(path, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// The account's 4 are spent: a refund waits although refunds have room.
	var de *DeadlineError
	if err := send("/v1/refunds", 20*time.Millisecond); !errors.As(err, &de) {
		t.Fatalf("a 5th request on the account: %v, want a refusal (the shared 4/s is spent)", err)
	}
	keys, err := c.Keys(context.Background(), "pace:{stripe|*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var suffixes []string
	for _, k := range keys {
		suffixes = append(suffixes, k[strings.LastIndex(k, "}")+1:])
	}
	if want := []string{":account", ":charges", ":refunds"}; !slices.Equal(suffixes, want) {
		t.Errorf("keys %q, want one shared account bucket and one per endpoint %q", keys, want)
	}
}
