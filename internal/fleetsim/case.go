// Package fleetsim runs a fleet of pace's processes against a model of an
// upstream API, on one virtual clock (testing/synctest): the real Redis
// limiters and Transports, each process with its own pace.Process and
// go-redis client, the embedded Redis-protocol store served over in-memory
// connections whose TIME follows the virtual clock, and a seeded network
// with latency, jitter and faults between them. Every run checks the
// invariants pace promises (invariants.go), and a seed replays its run.
package fleetsim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/pace"
)

// A Case is one simulated run: the upstream, how it answers, the fleet and
// its network, and the faults. Its text (String) is a list of key=value
// pairs that Parse reads back, so that a run printed is a run replayed.
type Case struct {
	Upstream   string        // a family of upstreamModels: strict, nginx, haproxy, window, github
	Rate       float64       // the upstream's requests a second (a window's count per Window)
	Burst      int           // the upstream's burst (strict, nginx)
	Slack      int           // tokens the strict bucket holds beyond its burst
	Window     time.Duration // a window's length (window, github)
	RetryAfter string        // on every refusal: "" none, whole seconds, or "auto" (until admitted, rounded up)
	Counters   string        // the counters on every answer: none, openai, github, ietf
	Body       string        // what a body says: none, retryinfo (a refusal's delay), shopify (the bucket, every answer)
	Procs      int           // processes
	Workers    int           // goroutines in each, one request after another
	Duration   time.Duration // how long they send
	Limit      string        // pace's limit (pace.ParseLimit); "" is the upstream's own
	Cost       int           // tokens a request takes, of pace's limit and the upstream's
	Latency    time.Duration // one way, to the upstream
	Jitter     time.Duration // at most, added to each one-way trip to the upstream
	// Connect is added to each worker's first trip to the upstream: its
	// connection's handshakes, and the start's processes on a busy machine.
	Connect time.Duration
	// Redis's link, one way: a fleet's Redis sits in its own network, its
	// upstream across the Internet.
	RedisLatency time.Duration
	RedisJitter  time.Duration
	Faults       string // none, kill, stall, slowlink, lostreply, flush, pause
	// Others is a client outside the fleet that spends the upstream's
	// quota too: its requests a second, sent evenly from the run's start
	// for OthersFor (0: the whole run), each on its own trip of the
	// upstream's link, whatever the answers.
	Others    float64
	OthersFor time.Duration
	MaxHold   time.Duration // the limiters' WithMaxHold
	Leases    string        // the limiters' token leases: on (the default) or off (see pace.WithTokenLeases)
	Seed      uint64        // the network's and the faults' draws
}

// fields are c's fields by their keys, in the order String writes them.
func (c *Case) fields() []field {
	return []field{{"upstream", &c.Upstream}, {"rate", &c.Rate}, {"burst", &c.Burst}, {"slack", &c.Slack},
		{"window", &c.Window}, {"retry_after", &c.RetryAfter}, {"counters", &c.Counters}, {"body", &c.Body},
		{"procs", &c.Procs}, {"workers", &c.Workers}, {"duration", &c.Duration}, {"limit", &c.Limit},
		{"cost", &c.Cost}, {"latency", &c.Latency}, {"jitter", &c.Jitter}, {"connect", &c.Connect},
		{"redis_latency", &c.RedisLatency}, {"redis_jitter", &c.RedisJitter}, {"faults", &c.Faults},
		{"others", &c.Others}, {"others_for", &c.OthersFor}, {"max_hold", &c.MaxHold}, {"leases", &c.Leases}, {"seed", &c.Seed}}
}

// A field is one of a Case's fields: its key, and a pointer to it.
type field struct {
	key string
	ptr any // *string, *int, *uint64, *float64 or *time.Duration
}

func (f field) String() string {
	switch p := f.ptr.(type) {
	case *string:
		return *p
	case *int:
		return strconv.Itoa(*p)
	case *uint64:
		return strconv.FormatUint(*p, 10)
	case *float64:
		return strconv.FormatFloat(*p, 'g', -1, 64)
	default:
		return f.ptr.(*time.Duration).String()
	}
}

// set reads v into the field.
func (f field) set(v string) (err error) {
	switch p := f.ptr.(type) {
	case *string:
		*p = v
	case *int:
		*p, err = strconv.Atoi(v)
	case *uint64:
		*p, err = strconv.ParseUint(v, 10, 64)
	case *float64:
		*p, err = strconv.ParseFloat(v, 64)
	default:
		*f.ptr.(*time.Duration), err = time.ParseDuration(v)
	}
	if err != nil {
		return fmt.Errorf("fleetsim: %s=%s: want a value of its kind, such as %s", f.key, v, f.String())
	}
	return nil
}

// Default is the case every Parse starts from.
func Default() Case {
	return Case{Upstream: "strict", Rate: 100, Burst: 5, Window: time.Second, Counters: "none", Body: "none",
		Procs: 3, Workers: 3, Duration: 6 * time.Second, Cost: 1, Latency: time.Millisecond,
		Jitter: 500 * time.Microsecond, RedisLatency: 200 * time.Microsecond, RedisJitter: 100 * time.Microsecond,
		Faults: "none", MaxHold: pace.DefaultMaxHold, Leases: "on", Seed: 1}
}

// String writes c as Parse reads it.
func (c Case) String() string {
	var pairs []string
	for _, f := range c.fields() {
		v := f.String()
		if strings.ContainsAny(v, " '") || v == "" {
			v = "'" + v + "'"
		}
		pairs = append(pairs, f.key+"="+v)
	}
	return strings.Join(pairs, " ")
}

// Parse reads a case: space-separated key=value pairs over Default, a
// value with spaces in single quotes, as in
// "upstream=nginx rate=50 burst=5 limit='100/s burst 5' retry_after=1".
func Parse(spec string) (Case, error) {
	c := Default()
	pairs, err := split(spec)
	if err != nil {
		return c, err
	}
	for _, p := range pairs {
		if err := c.set(p); err != nil {
			return c, err
		}
	}
	if c.RetryAfter == "none" {
		c.RetryAfter = ""
	}
	return c, c.check()
}

// set reads one key=value pair into c.
func (c *Case) set(pair string) error {
	k, v, _ := strings.Cut(pair, "=")
	var keys []string
	for _, f := range c.fields() {
		if f.key == k {
			return f.set(v)
		}
		keys = append(keys, f.key)
	}
	return fmt.Errorf("fleetsim: unknown key %q: want one of %s", k, strings.Join(keys, ", "))
}

// split cuts spec at spaces outside single quotes, and drops the quotes.
func split(spec string) ([]string, error) {
	var out []string
	var cur strings.Builder
	quoted, any := false, false
	for _, r := range spec {
		switch {
		case r == '\'':
			quoted, any = !quoted, true
		case r == ' ' && !quoted:
			if any {
				out = append(out, cur.String())
			}
			cur.Reset()
			any = false
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("fleetsim: case %q: a quote is not closed", spec)
	}
	if any {
		out = append(out, cur.String())
	}
	return out, nil
}

// Families, dialects and faults the simulator knows.
var (
	Upstreams = []string{"strict", "nginx", "haproxy", "window", "github"}
	Counters  = []string{"none", "openai", "github", "ietf"}
	Bodies    = []string{"none", "retryinfo", "shopify"}
	Faults    = []string{"none", "kill", "stall", "slowlink", "lostreply", "flush", "pause"}
)

// check reports a case that cannot run, naming the key.
func (c Case) check() error {
	in := func(k, v string, set []string) error {
		if !slices.Contains(set, v) {
			return fmt.Errorf("fleetsim: %s=%s: want one of %s", k, v, strings.Join(set, ", "))
		}
		return nil
	}
	for _, err := range []error{in("upstream", c.Upstream, Upstreams), in("counters", c.Counters, Counters),
		in("body", c.Body, Bodies), in("faults", c.Faults, Faults), in("leases", c.Leases, []string{"on", "off"})} {
		if err != nil {
			return err
		}
	}
	if _, err := c.retryAfter(0); err != nil {
		return err
	}
	switch {
	case !(c.Rate > 0 && c.Rate <= 100_000):
		return fmt.Errorf("fleetsim: rate=%v: want more than 0, at most 100000", c.Rate)
	case c.Burst < 1 || c.Slack < 0 || c.Cost < 1 || c.Cost > c.Burst:
		return fmt.Errorf("fleetsim: burst=%d slack=%d cost=%d: want a burst of 1 or more, a slack of 0 or more, a cost from 1 to the burst", c.Burst, c.Slack, c.Cost)
	case c.Procs < 1 || c.Procs > 64 || c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("fleetsim: procs=%d workers=%d: want 1 to 64 each", c.Procs, c.Workers)
	case c.Duration < time.Second || c.Duration > time.Hour:
		return fmt.Errorf("fleetsim: duration=%v: want 1s to 1h", c.Duration)
	case !(c.Others >= 0 && c.Others <= 100_000) || c.OthersFor < 0:
		return fmt.Errorf("fleetsim: others=%v others_for=%v: want a rate from 0 to 100000 and no negative time", c.Others, c.OthersFor)
	case c.Window < time.Millisecond || c.MaxHold < time.Millisecond || min(c.Latency, c.Jitter, c.Connect, c.RedisLatency, c.RedisJitter) < 0:
		return fmt.Errorf("fleetsim: window=%v max_hold=%v latency=%v jitter=%v connect=%v redis_latency=%v redis_jitter=%v: want a window and a max_hold of 1ms or more, no negative time",
			c.Window, c.MaxHold, c.Latency, c.Jitter, c.Connect, c.RedisLatency, c.RedisJitter)
	}
	l, err := c.paceLimit()
	if err != nil {
		return err
	}
	if c.Cost > l.Burst() {
		return fmt.Errorf("fleetsim: cost=%d is more than the limit %q's burst", c.Cost, c.Limit)
	}
	return nil
}

// paceLimit is the limit the fleet's limiters are built with: Limit, or
// the upstream's own rate (a window's count over its length) and burst.
func (c Case) paceLimit() (pace.Limit, error) {
	if c.Limit == "" {
		return pace.Per(c.Rate, c.period()).WithBurst(c.Burst), nil
	}
	l, err := pace.ParseLimit(c.Limit)
	if err != nil {
		return l, fmt.Errorf("fleetsim: limit=%q: %w", c.Limit, err)
	}
	if !isBucket(l) {
		return l, fmt.Errorf("fleetsim: limit=%q: want a token bucket, such as '100/s burst 5'", c.Limit)
	}
	return l, nil
}

// UpstreamAllows is the most c's upstream serves in a run of c, as its
// model counts it (from a run's start in synctest's epoch).
func (c Case) UpstreamAllows() float64 {
	start := time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)
	return newModel(c).allowed(start, start.Add(c.Duration))
}

// period is the time the upstream's Rate counts: a window's length, or a
// second.
func (c Case) period() time.Duration {
	if c.Upstream == "window" || c.Upstream == "github" {
		return c.Window
	}
	return time.Second
}

// upstreamRate is the upstream's rate a second.
func (c Case) upstreamRate() float64 { return c.Rate / c.period().Seconds() }

// isBucket reports whether l is a plain token bucket, whose text is
// COUNT/PERIOD [burst N]: not a window, a cap, a calendar, nor learning.
func isBucket(l pace.Limit) bool {
	rate, rest, _ := strings.Cut(l.String(), " ")
	plain := strings.Contains(rate, "/") && !strings.HasSuffix(rate, "/day") && !strings.HasSuffix(rate, "/month")
	return plain && (rest == "" || strings.HasPrefix(rest, "burst ") && !strings.Contains(rest, "learn"))
}

// retryAfter is the Retry-After of a refusal whose request the upstream
// would admit in wait: none, RetryAfter's seconds, or wait's, rounded up.
func (c Case) retryAfter(wait time.Duration) (string, error) {
	switch c.RetryAfter {
	case "":
		return "", nil
	case "auto":
		return strconv.FormatInt(max(int64((wait+time.Second-1)/time.Second), 1), 10), nil
	}
	if n, err := strconv.Atoi(c.RetryAfter); err != nil || n < 0 || n > 3600 {
		return "", fmt.Errorf("fleetsim: retry_after=%s: want none, auto, or whole seconds from 0 to 3600", c.RetryAfter)
	}
	return c.RetryAfter, nil
}

// Draw returns a case drawn from the whole space by seed: a family and
// its dialect, a burst from 1 to 20, pace's limit 0.5 to 2 times the
// upstream's, 1 to 16 processes, the upstream's jitter from none to tens
// of milliseconds, connections opened in none to 10 ms or two of its
// round trips, Redis's link a LAN's, and now and then a fault.
func Draw(seed uint64) Case {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	c := Default()
	c.Seed = seed
	c.Upstream = Upstreams[r.IntN(len(Upstreams))]
	c.Rate = float64([]int{10, 20, 50, 100, 150, 200, 400}[r.IntN(7)])
	c.Burst = 1 + r.IntN(20)
	if r.IntN(4) == 0 {
		c.Slack = 1
	}
	c.Procs = []int{1, 2, 3, 4, 8, 16}[r.IntN(6)]
	c.Workers = 1 + r.IntN(4)
	c.Duration = time.Duration(3+r.IntN(4)) * time.Second
	c.Latency = []time.Duration{0, 200 * time.Microsecond, time.Millisecond, 5 * time.Millisecond}[r.IntN(4)]
	c.Jitter = []time.Duration{0, 100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond}[r.IntN(5)]
	c.RetryAfter = []string{"", "", "1", "auto"}[r.IntN(4)]
	c.Counters = Counters[r.IntN(len(Counters))]
	switch c.Upstream {
	case "window", "github":
		c.Window = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second}[r.IntN(3)]
		if c.Upstream == "github" {
			c.Counters = "github"
		}
	case "strict":
		c.Body = Bodies[r.IntN(len(Bodies))]
	}
	if factor := []float64{0.5, 0.8, 1, 1, 1, 1.25, 2}[r.IntN(7)]; factor != 1 {
		c.Limit = pace.Per(c.Rate*factor, c.period()).WithBurst(c.Burst).String()
	}
	if r.IntN(5) == 0 {
		c.Faults = Faults[1+r.IntN(len(Faults)-1)]
	}
	c.MaxHold = []time.Duration{pace.DefaultMaxHold, pace.DefaultMaxHold, time.Second, 3 * time.Second}[r.IntN(4)]
	c.RedisLatency = []time.Duration{100 * time.Microsecond, 200 * time.Microsecond, time.Millisecond}[r.IntN(3)]
	c.RedisJitter = []time.Duration{0, 100 * time.Microsecond, time.Millisecond}[r.IntN(3)]
	c.Connect = []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond, 4 * c.Latency}[r.IntN(4)]
	// Size the run by requests: a simulated second costs about a real
	// millisecond per few requests.
	for c.upstreamRate()*c.Duration.Seconds() > 1500 && c.Duration > time.Second {
		c.Duration -= time.Second
	}
	return c
}
