package main

import (
	"bufio"
	"context"
	"encoding/gob"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
)

// The hot-key scenario: hotProcs processes (this command, run again as a
// child) on one redis-server, each with hotWorkers goroutines waiting on
// one key of hotRate/s burst hotBurst for hotLength, one grant after
// another.
const (
	hotProcs   = 16
	hotWorkers = 8
	hotRate    = 50000
	hotBurst   = 1000
	hotLength  = 10 * time.Second
	hotKey     = "bench:hot"
)

// hotVariants are the limiters the scenario runs, in turn.
var hotVariants = []string{"pace, token leases", "pace, one call a grant", "redis_rate (deny, sleep RetryAfter, retry)"}

// hotChild is what a child reports: when each of its grants came
// (UnixNano), how long each wait took, and its round trips to Redis (see
// commandCounter) from start to its last grant.
type hotChild struct {
	Grants []int64
	Waits  []time.Duration
	Calls  int64
}

// hotResult is one variant's figures.
type hotResult struct {
	Variant       string  `json:"variant"`
	GrantsPerSec  float64 `json:"grants_per_second"`
	CallsPerGrant float64 `json:"redis_calls_per_grant"`
	RedisCPU      float64 `json:"redis_cpu_percent"`
	MostIn1s      int     `json:"most_grants_in_1s"`
	Bound         int     `json:"b_plus_r"`
	LeastShare    float64 `json:"least_share_of_fair"`
	MostShare     float64 `json:"most_share_of_fair"`
	WaitP50       float64 `json:"wait_p50_ms"`
	WaitP99       float64 `json:"wait_p99_ms"`
}

// runHotKey runs every variant on a redis-server of its own and prints the
// table (or JSON).
func runHotKey(asJSON bool) error {
	addr, stop, err := startRedis()
	if err != nil {
		return err
	}
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var results []hotResult
	for v, name := range hotVariants {
		fmt.Fprintf(os.Stderr, "hotkey: %s\n", name)
		res, err := hotVariant(rdb, addr, v)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		res.Variant = name
		results = append(results, res)
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(results)
	}
	fmt.Print(hotTable(results))
	return nil
}

// hotVariant runs variant v's children together and measures them.
func hotVariant(rdb *redis.Client, addr string, v int) (hotResult, error) {
	ctx := context.Background()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return hotResult{}, err
	}
	start := time.Now().Add(2 * time.Second) // the children start and connect first
	before, err := redisCPU(rdb)
	if err != nil {
		return hotResult{}, err
	}
	children := make([]hotChild, hotProcs)
	errs := make([]error, hotProcs)
	var wg sync.WaitGroup
	for p := range hotProcs {
		wg.Go(func() { children[p], errs[p] = runChild(addr, v, start) })
	}
	wg.Wait()
	after, err := redisCPU(rdb)
	if err != nil {
		return hotResult{}, err
	}
	for _, err := range errs {
		if err != nil {
			return hotResult{}, err
		}
	}
	return measureHot(children, start, after-before), nil
}

// runChild runs one child process of variant v from start, and returns
// what it reports.
func runChild(addr string, v int, start time.Time) (hotChild, error) {
	cmd := exec.Command(os.Args[0], "-hotkey-child", fmt.Sprintf("%d,%s,%d", v, addr, start.UnixNano()))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return hotChild{}, err
	}
	if err := cmd.Start(); err != nil {
		return hotChild{}, err
	}
	var c hotChild
	decodeErr := gob.NewDecoder(bufio.NewReader(out)).Decode(&c)
	if err := cmd.Wait(); err != nil {
		return hotChild{}, err
	}
	return c, decodeErr
}

// hotChildMain is a child: spec is "VARIANT,ADDR,START".
func hotChildMain(spec string) error {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		return fmt.Errorf("-hotkey-child %q: want VARIANT,ADDR,START", spec)
	}
	v, _ := strconv.Atoi(f[0])
	startNanos, _ := strconv.ParseInt(f[2], 10, 64)
	rdb := redis.NewClient(&redis.Options{Addr: f[1], PoolSize: hotWorkers})
	defer rdb.Close()
	counter := &commandCounter{}
	rdb.AddHook(counter)
	wait, closeWait, err := hotWait(rdb, v)
	if err != nil {
		return err
	}
	defer closeWait()
	start := time.Unix(0, startNanos)
	time.Sleep(time.Until(start))
	counter.n.Store(0)
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(hotLength))
	defer cancel()
	var mu sync.Mutex
	var report hotChild
	var wg sync.WaitGroup
	for range hotWorkers {
		wg.Go(func() {
			var grants []int64
			var waits []time.Duration
			for ctx.Err() == nil {
				began := time.Now()
				if wait(ctx) != nil {
					break
				}
				now := time.Now()
				grants, waits = append(grants, now.UnixNano()), append(waits, now.Sub(began))
			}
			mu.Lock()
			defer mu.Unlock()
			report.Grants, report.Waits = append(report.Grants, grants...), append(report.Waits, waits...)
		})
	}
	wg.Wait()
	report.Calls = counter.n.Load()
	return gob.NewEncoder(os.Stdout).Encode(report)
}

// hotWait is variant v's wait for one grant of hotKey.
func hotWait(rdb *redis.Client, v int) (wait func(context.Context) error, closeWait func(), err error) {
	if v == 2 {
		l, lim := redis_rate.NewLimiter(rdb), redis_rate.Limit{Rate: hotRate, Burst: hotBurst, Period: time.Second}
		return func(ctx context.Context) error {
			for {
				res, err := l.Allow(ctx, hotKey, lim)
				if err != nil || res.Allowed > 0 {
					return err
				}
				time.Sleep(res.RetryAfter)
			}
		}, func() {}, nil
	}
	l, err := pace.NewRedis(rdb, pace.PerSecond(hotRate).WithBurst(hotBurst), pace.WithTokenLeases(v == 0)) // the fleet counted by heartbeats, as by default
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) error { return l.Wait(ctx, hotKey, 1) }, func() { l.Close() }, nil
}

// measureHot computes a variant's figures from its children's reports.
func measureHot(children []hotChild, start time.Time, cpu float64) hotResult {
	var calls int64
	var grants []int64
	var waits []time.Duration
	counts := make([]int, len(children))
	end := start.Add(hotLength).UnixNano()
	for p, c := range children {
		calls += c.Calls
		for i, g := range c.Grants {
			if g < end {
				grants, waits = append(grants, g), append(waits, c.Waits[i])
				counts[p]++
			}
		}
	}
	slices.Sort(grants)
	slices.Sort(waits)
	most := 0
	for i, j := 0, 0; j < len(grants); j++ {
		for grants[j]-grants[i] >= int64(time.Second) {
			i++
		}
		most = max(most, j-i+1)
	}
	fair := float64(len(grants)) / float64(len(children))
	res := hotResult{GrantsPerSec: float64(len(grants)) / hotLength.Seconds(), MostIn1s: most, Bound: hotBurst + hotRate,
		RedisCPU: 100 * cpu / hotLength.Seconds(), LeastShare: float64(slices.Min(counts)) / fair, MostShare: float64(slices.Max(counts)) / fair}
	if len(grants) > 0 {
		res.CallsPerGrant = float64(calls) / float64(len(grants))
		res.WaitP50 = float64(waits[len(waits)/2]) / 1e6
		res.WaitP99 = float64(waits[len(waits)*99/100]) / 1e6
	}
	return res
}

// redisCPU reads the CPU time a redis-server has used, in seconds, from
// INFO.
func redisCPU(rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var cpu float64
	for line := range strings.Lines(info) {
		if name, secs, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			s, _ := strconv.ParseFloat(secs, 64)
			cpu += s
		}
	}
	return cpu, nil
}

// hotTable is the results as a Markdown table.
func hotTable(results []hotResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| %d processes x %d goroutines, one key of %d/s burst %d, %v | grants/s | of the rate | Redis calls per grant | Redis CPU | most grants in 1 s (b + r = %d) | least / most process share of fair | wait p50 | wait p99 |\n",
		hotProcs, hotWorkers, hotRate, hotBurst, hotLength, hotBurst+hotRate)
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.0f | %.1f%% | %.3f | %.0f%% | %d | %.2f / %.2f | %.2f ms | %.2f ms |\n", r.Variant, r.GrantsPerSec,
			100*r.GrantsPerSec/hotRate, r.CallsPerGrant, r.RedisCPU, r.MostIn1s, r.LeastShare, r.MostShare, r.WaitP50, r.WaitP99)
	}
	return b.String()
}
