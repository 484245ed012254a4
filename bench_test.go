package pace

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// Each benchmark here runs its baseline first, in the same run, and reports
// its own time per operation as a ratio to it ("x-ping", "x-rate").

// unlimited is a limit the benchmarks never exhaust: they measure the cost of
// a decision, not a wait.
var unlimited = PerSecond(1e6).WithBurst(1e12)

// oneCallEach makes every wait a decision of its own: a benchmark's key is
// hot, and would take its tokens by leases (see WithTokenLeases).
var oneCallEach = WithTokenLeases(false)

// BenchmarkRedisWait: a Redis wait when tokens are available, serial and from
// 32 goroutines, beside a go-redis PING on the same client. It also reports
// Redis's own time per script call, from INFO commandstats. "wait" uses a
// client with ContextTimeoutEnabled, as the README recommends;
// "wait-default-client" one with go-redis's defaults, whose calls pace runs
// on a goroutine of their own to hold the call timeout. Both make one call
// a wait; "wait-leased" takes the hot key's tokens by leases (see
// WithTokenLeases), its default.
func BenchmarkRedisWait(b *testing.B) {
	ctx := context.Background()
	srv, c := benchRedis(b)
	defaultClient := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
	defer defaultClient.Close()
	for _, mode := range benchModes {
		var ping float64
		b.Run(mode.name+"/ping", func(b *testing.B) {
			loop(b, mode.parallel, func() error { return c.Ping(ctx).Err() })
			ping = perOp(b)
		})
		for _, variant := range []struct {
			name   string
			client *redis.Client
			leases bool
		}{{"wait", c, false}, {"wait-default-client", defaultClient, false}, {"wait-leased", c, true}} {
			r := mustRedis(b, variant.client, unlimited, WithTokenLeases(variant.leases), WithFleetSize(1))
			b.Run(mode.name+"/"+variant.name, func(b *testing.B) {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				loop(b, mode.parallel, func() error { return r.Wait(ctx, "api.example.com:443", 1) })
				b.ReportMetric(perOp(b)/ping, "x-ping")
				stats, err := redistest.CommandStats(ctx, c)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(redistest.ScriptMicros(stats), "redis-µs/call")
			})
		}
	}
}

// BenchmarkQuotaWait: a decision over three limits at once (AllOf: 1e6/s,
// 1e9/h and 1e10/day, never exhausted), beside a one-limit decision in the
// same run.
func BenchmarkQuotaWait(b *testing.B) {
	ctx := context.Background()
	_, c := benchRedis(b)
	one := mustRedis(b, c, unlimited, oneCallEach)
	three := mustRedis(b, c, AllOf(unlimited, PerHour(1e9).WithBurst(1e12), Per(1e10, 24*time.Hour).WithBurst(1e12)), oneCallEach)
	beside(b, "one-limit", func() error { return one.Wait(ctx, "api.example.com:443", 1) },
		"three-limits", func() error { return three.Wait(ctx, "api.example.com:443", 1) })
}

// BenchmarkSettle: an LLM call's reservation (1 request and 400 tokens
// under two limits) settled at its usage, two script calls, beside a plain
// wait under the same two limits in the same run.
func BenchmarkSettle(b *testing.B) {
	ctx := context.Background()
	_, c := benchRedis(b)
	r := mustRedis(b, c, AllOf(unlimited.Named("requests"), unlimited.Named("tokens")))
	estimate, actual := Costs{"tokens": 400}, Costs{"tokens": 250}
	beside(b, "wait", func() error { return r.Wait(ctx, "llm.example.com:443", 1) },
		"reserve-settle", func() error {
			res, err := r.Reserve(ctx, "llm.example.com:443", estimate)
			if err != nil {
				return err
			}
			return r.Settle(ctx, res, actual)
		})
}

// BenchmarkSlots: a wait under a cap of requests in flight that is never
// full (the slot taken with the booking, in one script call, and freed in
// one more), beside a plain wait under the same rate limit in the same run.
func BenchmarkSlots(b *testing.B) {
	ctx := context.Background()
	_, c := benchRedis(b)
	plain := mustRedis(b, c, unlimited, oneCallEach)
	capped := mustRedis(b, c, AllOf(unlimited, Concurrent(maxSlots)))
	beside(b, "wait", func() error { return plain.Wait(ctx, "api.example.com:443", 1) },
		"acquire-release", func() error {
			slot, err := capped.Acquire(ctx, "api.example.com:443", 1)
			if err != nil {
				return err
			}
			return slot.Release()
		})
}

// BenchmarkTransportCounters: a request through a Transport on Redis, to
// an in-process upstream (no network) whose response states OpenAI's
// counters, or GitHub's (a Unix time, whose window's phase is noted: see
// steer.Phases), read and synced at most every 50 ms; beside the same
// response without counters, and with IgnoreCounters, in the same run.
func BenchmarkTransportCounters(b *testing.B) {
	ctx := context.Background()
	_, c := benchRedis(b)
	r := mustRedis(b, c, unlimited, oneCallEach)
	date := time.Now().UTC().Format(http.TimeFormat)
	counters := http.Header{"X-Ratelimit-Limit-Requests": {"60000000"}, "X-Ratelimit-Remaining-Requests": {"999999"},
		"X-Ratelimit-Reset-Requests": {"1ms"}, "Date": {date}}
	github := http.Header{"X-Ratelimit-Limit": {"9000000000000000"}, "X-Ratelimit-Remaining": {"8999999999999999"},
		"X-Ratelimit-Reset": {strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)}, "Date": {date}}
	for _, mode := range benchModes {
		var base float64
		for _, variant := range []struct {
			name   string
			header http.Header
			ignore bool
		}{{"silent", http.Header{}, false}, {"openai", counters, false}, {"github", github, false}, {"openai-ignored", counters, true}} {
			client := &http.Client{Transport: &Transport{Limiter: r, IgnoreCounters: variant.ignore, Base: answering(variant.header)}}
			b.Run(mode.name+"/"+variant.name, func(b *testing.B) {
				loop(b, mode.parallel, func() error {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/v1", nil)
					resp, err := client.Do(req)
					if err == nil {
						resp.Body.Close()
					}
					return err
				})
				if variant.name == "silent" {
					base = perOp(b)
				}
				b.ReportMetric(perOp(b)/base, "x-silent")
			})
		}
	}
}

// answering is an upstream in process: it answers every request with 200
// and header.
type answering http.Header

func (a answering) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header(a).Clone(), Body: http.NoBody, Request: req}, nil
}

// BenchmarkLocalWait: a Local wait when tokens are available, beside a bare
// rate.Limiter.Wait.
func BenchmarkLocalWait(b *testing.B) {
	ctx := context.Background()
	bare := rate.NewLimiter(rate.Limit(unlimited.Rate()), unlimited.Burst())
	loc := mustLocal(b, unlimited)
	for _, mode := range benchModes {
		var base float64
		b.Run(mode.name+"/rate.Limiter", func(b *testing.B) {
			loop(b, mode.parallel, func() error { return bare.Wait(ctx) })
			base = perOp(b)
		})
		b.Run(mode.name+"/local", func(b *testing.B) {
			loop(b, mode.parallel, func() error { return loc.Wait(ctx, "api.example.com:443", 1) })
			b.ReportMetric(perOp(b)/base, "x-rate")
		})
	}
}

// benchModes: each benchmark runs serially and from 32 goroutines.
var benchModes = []struct {
	name     string
	parallel bool
}{{"serial", false}, {"parallel32", true}}

// loop runs op b.N times, from one goroutine or from 32.
func loop(b *testing.B, parallel bool, op func() error) {
	b.ReportAllocs()
	if !parallel {
		for b.Loop() {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// beside runs, in each mode, the baseline op base, then op, and reports
// op's time as a ratio to base's ("x-" and base's name).
func beside(b *testing.B, baseName string, base func() error, name string, op func() error) {
	for _, mode := range benchModes {
		var basePerOp float64
		b.Run(mode.name+"/"+baseName, func(b *testing.B) {
			loop(b, mode.parallel, base)
			basePerOp = perOp(b)
		})
		b.Run(mode.name+"/"+name, func(b *testing.B) {
			loop(b, mode.parallel, op)
			b.ReportMetric(perOp(b)/basePerOp, "x-"+baseName)
		})
	}
}

func perOp(b *testing.B) float64 { return float64(b.Elapsed().Nanoseconds()) / float64(b.N) }

// benchRedis starts a redis-server pinned to the last CPU, and a client of
// it for 32 goroutines, closed when the benchmark ends.
func benchRedis(b *testing.B) (*redistest.Server, *redis.Client) {
	srv := redistest.Start(b)
	pinRedis(b, srv)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	return srv, c
}

// pinRedis moves redis-server to the CPUs the benchmark may not run on (make
// bench keeps it on CPU 0), so that on a small machine its time per call
// measures Redis, not the benchmark's goroutines preempting it, and a call
// costs the larger of the two sides' times, not their sum. Where the
// benchmark may run on every CPU, Redis takes the last of them.
// runtime.NumCPU counts the benchmark's own CPUs alone: under make bench it
// is 1, and Redis was pinned beside the benchmark, on CPU 0.
func pinRedis(b *testing.B, srv *redistest.Server) {
	var own, others unix.CPUSet
	if err := unix.SchedGetaffinity(0, &own); err != nil {
		b.Logf("redis-server stays unpinned: %v", err)
		return
	}
	last := 0
	for cpu := range 8 * int(unsafe.Sizeof(own)) {
		if own.IsSet(cpu) {
			last = cpu
		} else {
			others.Set(cpu)
		}
	}
	if unix.SchedSetaffinity(srv.Pid(), &others) == nil { // the kernel keeps those online, and refuses none
		return
	}
	var mine unix.CPUSet
	mine.Set(last)
	if err := unix.SchedSetaffinity(srv.Pid(), &mine); err != nil {
		b.Logf("redis-server stays unpinned: %v", err)
	}
}

// BenchmarkHoldsOnManyKeys: a hold heard of on one of 20,000 keys, beside
// one on one of 1,000: a hold does not pay for the keys heard of before
// ("x-1000", about 2 for a map 20 times larger; before, each hold swept
// them all: 13.4 us and 528 us a hold, 39x).
func BenchmarkHoldsOnManyKeys(b *testing.B) {
	holds := func(n int) func() error {
		var h heldKeys
		now := time.Now()
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "key" + strconv.Itoa(i)
			h.add(keys[i], 1, time.Hour, now)
		}
		i := 0
		return func() error {
			i = (i + 1) % n
			h.add(keys[i], int64(i), time.Hour, now)
			return nil
		}
	}
	beside(b, "1000", holds(1000), "20000", holds(20000))
}

// BenchmarkDemandCounting: what token leases add to a decision of a key
// that is not hot: waits spread over 2,000 keys, none of them waited on
// often enough to lease, each counted in the demand's table, beside the
// same waits with leases off.
func BenchmarkDemandCounting(b *testing.B) {
	ctx := context.Background()
	_, c := benchRedis(b)
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = "api" + strconv.Itoa(i) + ".example.com:443"
	}
	spread := func(r *Redis) func() error {
		var next atomic.Int64
		return func() error { return r.Wait(ctx, keys[next.Add(1)%int64(len(keys))], 1) }
	}
	beside(b, "leases-off", spread(mustRedis(b, c, unlimited, oneCallEach)), "counted", spread(mustRedis(b, c, unlimited)))
}
