// Command bench compares pace with its peers, in the same run, on the same
// redis-server (which it starts on loopback), against the same strict
// upstream, and writes the table to BENCHMARKS.md. `make bench` runs it.
//
// The peers are used the way their users must use them to wait:
// redis_rate denies, the caller sleeps RetryAfter and asks again; ulule's
// limiter denies, the caller sleeps until its window resets and asks again;
// a static x/time/rate split gives each worker its share; and with no
// limiter at all, the caller retries after each 429.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/redistest"
)

const (
	limitRate  = 200 // a second
	limitBurst = 10
	workers    = 8
	scenario   = 3 * time.Second
)

func main() {
	testing.Init()
	out := flag.String("o", "BENCHMARKS.md", "the file to write")
	which := flag.String("scenario", "", "hotkey: one key of 50,000/s across 16 processes, printed rather than written (see hotkey.go)")
	asJSON := flag.Bool("json", false, "with -scenario hotkey, print JSON")
	child := flag.String("hotkey-child", "", "run as one process of the hot-key scenario (the scenario starts them)")
	flag.Parse()
	flag.Set("test.benchtime", "300ms") // a round's measure of one decision: see decisionCosts
	var err error
	switch {
	case *child != "":
		err = hotChildMain(*child)
	case *which == "hotkey":
		err = runHotKey(*asJSON)
	case *which != "":
		err = fmt.Errorf("-scenario %q: want hotkey, or none for the table of BENCHMARKS.md", *which)
	default:
		err = run(*out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// contender is one way of waiting for the quota.
type contender struct {
	name string
	// wait blocks until worker w of busy may send; it uses rdb (whose
	// commands are counted) when it needs Redis.
	newWait func(rdb *redis.Client, busy int) func(ctx context.Context, w int) error
	// decide is one decision when tokens are available, for the cost per
	// decision; nil when there is no decision to measure.
	decide func(rdb *redis.Client) func(ctx context.Context) error
}

var key atomic.Int64 // a fresh key for each scenario

func freshKey() string { return "bench:" + strconv.FormatInt(key.Add(1), 10) }

func contenders() []contender {
	return []contender{
		{name: "pace",
			newWait: func(rdb *redis.Client, busy int) func(context.Context, int) error {
				l, _ := pace.NewRedis(rdb, pace.PerSecond(limitRate).WithBurst(limitBurst))
				k := freshKey()
				return func(ctx context.Context, _ int) error { return l.Wait(ctx, k, 1) }
			},
			decide: func(rdb *redis.Client) func(context.Context) error {
				l, _ := pace.NewRedis(rdb, pace.PerSecond(1e6).WithBurst(1e12), pace.WithTokenLeases(false)) // one decision a wait
				k := freshKey()
				return func(ctx context.Context) error { return l.Wait(ctx, k, 1) }
			}},
		{name: "redis_rate (deny, sleep RetryAfter, retry)",
			newWait: func(rdb *redis.Client, busy int) func(context.Context, int) error {
				l := redis_rate.NewLimiter(rdb)
				k, lim := freshKey(), redis_rate.Limit{Rate: limitRate, Burst: limitBurst, Period: time.Second}
				return func(ctx context.Context, _ int) error {
					for {
						res, err := l.Allow(ctx, k, lim)
						if err != nil || res.Allowed > 0 {
							return err
						}
						time.Sleep(res.RetryAfter)
					}
				}
			},
			decide: func(rdb *redis.Client) func(context.Context) error {
				l := redis_rate.NewLimiter(rdb)
				k, lim := freshKey(), redis_rate.Limit{Rate: 1e6, Burst: 1e6, Period: time.Second}
				return func(ctx context.Context) error { _, err := l.Allow(ctx, k, lim); return err }
			}},
		{name: "ulule/limiter (deny, sleep to the window's reset, retry)",
			newWait: func(rdb *redis.Client, busy int) func(context.Context, int) error {
				store, _ := ulredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: freshKey()})
				l := ulule.New(store, ulule.Rate{Period: time.Second, Limit: limitRate})
				k := freshKey()
				return func(ctx context.Context, _ int) error {
					for {
						c, err := l.Get(ctx, k)
						if err != nil || !c.Reached {
							return err
						}
						// Reset is in whole seconds: without a floor the caller
						// would spin on Redis for the rest of the second.
						time.Sleep(max(time.Until(time.Unix(c.Reset, 0)), 10*time.Millisecond))
					}
				}
			},
			decide: func(rdb *redis.Client) func(context.Context) error {
				store, _ := ulredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: freshKey()})
				l := ulule.New(store, ulule.Rate{Period: time.Second, Limit: 1e12})
				k := freshKey()
				return func(ctx context.Context) error { _, err := l.Get(ctx, k); return err }
			}},
		{name: "x/time/rate, a static share per worker",
			newWait: func(_ *redis.Client, busy int) func(context.Context, int) error {
				var shares []*rate.Limiter
				for range workers {
					shares = append(shares, rate.NewLimiter(limitRate/workers, max(limitBurst/workers, 1)))
				}
				return func(ctx context.Context, w int) error { return shares[w].Wait(ctx) }
			}},
		{name: "no limiter (retry after each 429)",
			newWait: func(_ *redis.Client, busy int) func(context.Context, int) error {
				return func(context.Context, int) error { return nil }
			}},
	}
}

// commandCounter counts the round trips a client makes to Redis: each
// command, and each pipeline once; not the handshake of a new connection
// (HELLO, CLIENT SETINFO), which is the pool's, not the limiter's.
type commandCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	names map[string]int
}

func (c *commandCounter) count(name string) {
	if name == "hello" || name == "client" {
		return
	}
	c.n.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[string]int{}
	}
	c.names[name]++
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.count(cmd.Name()); return next(ctx, cmd) }
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "hello" && cmds[0].Name() != "client" {
			c.count(cmds[0].Name() + " pipeline")
		}
		return next(ctx, cmds)
	}
}

// result is what one contender did in one scenario.
type result struct {
	granted, refused     int // the upstream's 200s and 429s
	callsPerGrant        float64
	waitP50, waitP99     time.Duration
	utilisation          float64
	decision, decision32 time.Duration
	allocs               int64
}

// saturate runs busy of the workers against a strict upstream for the
// scenario's length.
func saturate(c contender, redisAddr string, busy int) result {
	var counter commandCounter
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 2 * workers, ContextTimeoutEnabled: true})
	defer rdb.Close()
	rdb.AddHook(&counter)
	up := newUpstream()
	defer up.close()
	wait := c.newWait(rdb, busy)
	httpClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer httpClient.CloseIdleConnections()

	var mu sync.Mutex
	var waits []time.Duration
	var granted, refused int
	end := time.Now().Add(scenario)
	var wg sync.WaitGroup
	for w := range busy {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				ctx, cancel := context.WithDeadline(context.Background(), end)
				err := wait(ctx, w)
				cancel()
				if err != nil {
					return
				}
				waited := time.Since(start)
				resp, err := httpClient.Get(up.url)
				if err != nil {
					continue
				}
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode == http.StatusOK {
					granted++
					waits = append(waits, waited)
				} else {
					refused++
				}
				mu.Unlock()
				if resp.StatusCode != http.StatusOK {
					time.Sleep(5 * time.Millisecond) // a client's minimal backoff
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(waits)
	r := result{granted: granted, refused: refused}
	fmt.Fprintf(os.Stderr, "  %d of %d workers: %d granted, round trips %v\n", busy, workers, granted, counter.names)
	if granted > 0 {
		r.callsPerGrant = float64(counter.n.Load()) / float64(granted)
		r.waitP50, r.waitP99 = waits[len(waits)/2], waits[len(waits)*99/100]
	}
	r.utilisation = float64(granted) / (limitBurst + limitRate*scenario.Seconds())
	return r
}

// upstream enforces the limit strictly: a token bucket of the same rate and
// burst, with one token of slack for the jitter between a grant and its
// arrival.
type upstream struct {
	server *http.Server
	url    string
}

func newUpstream() *upstream {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	bucket := rate.NewLimiter(limitRate, limitBurst+1)
	u := &upstream{url: "http://" + ln.Addr().String() + "/"}
	u.server = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !bucket.Allow() {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	go u.server.Serve(ln)
	return u
}

func (u *upstream) close() { u.server.Close() }

// rounds is how many times each contender's decision is measured: the
// contenders in turn, the order rotating, so that the machine's drift
// (a VM's Redis time moves by a third from one minute to the next) weighs
// on all alike.
const rounds = 7

// decisionCosts are the contenders' decisions when tokens are available:
// serial, from 32 goroutines, and Redis's own time, each the median of
// its rounds.
type decisionCosts struct {
	serial, parallel []time.Duration
	allocs           []int64
	redisMicros      []float64
	// ratios are each round's figures of a contender over the first's
	// (pace over redis_rate), by contender, then serial, parallel, Redis.
	ratios [][3][]float64
}

// measureDecisions measures the decisions of cs, those that have one, in
// rounds, against cs[base]'s in each round.
func measureDecisions(cs []contender, redisAddr string, base int) decisionCosts {
	n := len(cs)
	d := decisionCosts{serial: make([]time.Duration, n), parallel: make([]time.Duration, n), allocs: make([]int64, n),
		redisMicros: make([]float64, n), ratios: make([][3][]float64, n)}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 32, ContextTimeoutEnabled: true})
	defer rdb.Close()
	decides := make([]func(context.Context) error, n)
	for i, c := range cs {
		if c.decide != nil {
			decides[i] = c.decide(rdb)
		}
	}
	var runs [][rounds][3]float64 = make([][rounds][3]float64, n)
	for r := range rounds {
		for k := range n {
			i := (k + r) % n
			if decides[i] == nil {
				continue
			}
			s, p, allocs := decisionCost(decides[i])
			runs[i][r] = [3]float64{float64(s), float64(p), redisTime(rdb, decides[i])}
			d.allocs[i] = allocs
		}
	}
	for i := range n {
		if decides[i] == nil {
			continue
		}
		for m := range 3 {
			var own, ratio []float64
			for r := range rounds {
				own = append(own, runs[i][r][m])
				ratio = append(ratio, runs[i][r][m]/runs[base][r][m])
			}
			d.ratios[i][m] = ratio
			switch m {
			case 0:
				d.serial[i] = time.Duration(median(own))
			case 1:
				d.parallel[i] = time.Duration(median(own))
			case 2:
				d.redisMicros[i] = median(own)
			}
		}
	}
	return d
}

// median is the median of xs, which it sorts.
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// decisionCost measures decide when tokens are available, serial and from
// 32 goroutines, and the allocations of one.
func decisionCost(decide func(context.Context) error) (serial, parallel time.Duration, allocs int64) {
	ctx := context.Background()
	s := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decide(ctx)
		}
	})
	p := testing.Benchmark(func(b *testing.B) {
		b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				decide(ctx)
			}
		})
	})
	return time.Duration(s.NsPerOp()), time.Duration(p.NsPerOp()), s.AllocsPerOp()
}

// redisTime is Redis's own time per decision of decide, in microseconds,
// from INFO commandstats over 5,000 decisions in a row: its script calls'
// (whose commands Redis counts again under their own names), or, for a
// limiter that runs no script, all its commands'.
func redisTime(rdb *redis.Client, decide func(context.Context) error) float64 {
	const decisions = 5_000
	ctx := context.Background()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return 0
	}
	for range decisions {
		decide(ctx)
	}
	stats, err := redistest.CommandStats(ctx, rdb)
	if err != nil {
		return 0
	}
	if scripts := redistest.ScriptCalls(stats); scripts > 0 {
		return redistest.ScriptMicros(stats) * float64(scripts) / decisions
	}
	var total float64
	for name, st := range stats {
		if name != "config|resetstat" && name != "info" {
			total += st.MicrosPerOp * float64(st.Calls)
		}
	}
	return total / decisions
}

// startRedis runs a redis-server on a free loopback port until stop.
func startRedis() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting redis-server (make bench installs it): %w", err)
	}
	addr = "127.0.0.1:" + port
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); rdb.Ping(context.Background()).Err() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
	}
	return addr, func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

func run(out string) error {
	addr, stop, err := startRedis()
	if err != nil {
		return err
	}
	defer stop()
	var table strings.Builder
	fmt.Fprintf(&table, "| | decision, serial | decision, 32 goroutines | Redis's time per decision | allocs/decision | Redis calls per grant | wait p50 | wait p99 | utilisation, 8 of 8 busy | utilisation, 2 of 8 busy | 429s |\n")
	fmt.Fprintf(&table, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	cs := contenders()
	fmt.Fprintf(os.Stderr, "decisions, %d rounds\n", rounds)
	decisions := measureDecisions(cs, addr, 1)
	for i, c := range cs {
		fmt.Fprintf(os.Stderr, "%s\n", c.name)
		serial, parallel, allocs, redisMicros := decisions.serial[i], decisions.parallel[i], decisions.allocs[i], decisions.redisMicros[i]
		full := saturate(c, addr, workers)
		two := saturate(c, addr, 2)
		cost := func(d time.Duration) string {
			if d == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f µs", float64(d)/1e3)
		}
		allocText, redisText := "-", "-"
		if c.decide != nil {
			allocText, redisText = strconv.FormatInt(allocs, 10), fmt.Sprintf("%.2f µs", redisMicros)
		}
		fmt.Fprintf(&table, "| %s | %s | %s | %s | %s | %.2f | %.1f ms | %.1f ms | %.1f%% | %.1f%% | %d |\n",
			c.name, cost(serial), cost(parallel), redisText, allocText, full.callsPerGrant,
			float64(full.waitP50)/1e6, float64(full.waitP99)/1e6, 100*full.utilisation, 100*two.utilisation, full.refused+two.refused)
	}
	host, _ := os.Hostname()
	redisVersion, _ := exec.Command("redis-server", "--version").Output()
	doc := fmt.Sprintf(`# Benchmarks

pace beside its peers, measured in one run on one redis-server on loopback,
against one upstream that enforces %d/s burst %d strictly (429 beyond it, with one
token of slack). Each scenario lasts %v with %d workers in one process (or 2 of
them busy), each sending one request after another; waits are from the start of
an attempt to the grant; the fair share of the 8 is %v. Peers wait the way their
users must: redis_rate denies and its caller sleeps RetryAfter and asks again;
ulule/limiter denies and its caller sleeps until its window resets (at least
10 ms, since the reset is given in whole seconds); the static
split gives each worker %d/s. Redis calls count every round trip a limiter
makes (a command, or a pipeline), pace's heartbeats and each worker's last wait
(refused, as it would end after the scenario) included; not the handshake of a
new connection. Redis's time per decision is its own (INFO commandstats) over
5,000 decisions in a row: a script's calls, or all the commands of a limiter
that runs none. Each decision's figures are the median of %d rounds, the
limiters measured in turn in each, the order rotating.

%s
%s

Machine: %s, %d CPUs (GOMAXPROCS %d), %s, %s.

Command: `+"`make bench`"+` (runs `+"`go run .`"+` in bench/, and the testing.B benchmarks of the
core package).
`, limitRate, limitBurst, scenario, workers, time.Second*workers/limitRate, limitRate/workers, rounds,
		table.String(), againstBase(decisions, cs), host, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), strings.TrimSpace(string(redisVersion)))
	return os.WriteFile(out, []byte(doc+hotKeySection(out)), 0o644)
}

// hotKeySection is the hot-key scenario's section of the file out, kept
// as it is: the scenario prints its table, which is pasted there by hand
// (it takes 16 processes, and a machine of its own).
func hotKeySection(out string) string {
	old, _ := os.ReadFile(out)
	if i := strings.Index(string(old), hotKeyHeading); i >= 0 {
		return "\n" + string(old[i:])
	}
	return ""
}

// hotKeyHeading starts the hot-key scenario's section of BENCHMARKS.md.
const hotKeyHeading = "## One hot key"

// againstBase says pace's decision over redis_rate's, round by round.
func againstBase(d decisionCosts, cs []contender) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s's decision over %s's, in the same rounds (the median, and the least and the most of the %d):", cs[0].name, strings.Fields(cs[1].name)[0], rounds)
	for m, what := range []string{"serial", "from 32 goroutines", "Redis's time"} {
		ratios := d.ratios[0][m]
		mid := median(ratios) // sorts them
		sep := ","
		if m == 2 {
			sep = "."
		}
		fmt.Fprintf(&b, " %s %.2fx (%.2f to %.2f)%s", what, mid, ratios[0], ratios[len(ratios)-1], sep)
	}
	return b.String()
}
