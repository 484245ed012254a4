package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
)

// TestInspect: against a real redis-server holding known state (a booked
// schedule, a hold, a rate cut by a refusal, a sliding window, a cap's
// slots, two fleet members), the report says each.
func TestInspect(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	booked, err := pace.NewRedis(c, pace.PerSecond(1).WithBurst(1), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer booked.Close()
	ahead, err := pace.NewRedis(c, pace.PerMinute(1).WithBurst(1), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Close()
	if err := ahead.Wait(ctx, "api", 1); err != nil { // the schedule is a minute ahead: the key outlives a slow test
		t.Fatal(err)
	}
	// Two limits on one key, a deploy rolling out: the second's wait goes
	// at the stricter first's, a minute away, and is refused.
	if err := ahead.Wait(ctx, "deploy", 1); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	var late *pace.DeadlineError
	if err := booked.Wait(short, "deploy", 1); !errors.As(err, &late) || late.Delay < 50*time.Second {
		t.Fatalf("a wait at 1/s after one at 1/m on one key: %v, want a wait of about a minute refused", err)
	}
	if err := booked.Hold(ctx, "held", headers.Hold{For: 30 * time.Second, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	window, err := pace.NewRedis(c, pace.Window(5, time.Minute), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer window.Close()
	for range 3 {
		if err := window.Wait(ctx, "search", 1); err != nil {
			t.Fatal(err)
		}
	}
	capped, err := pace.NewRedis(c, pace.Concurrent(4), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	slot, err := capped.Acquire(ctx, "tts", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTooManyRequests) }))
	defer refusing.Close()
	quick, err := pace.NewRedis(c, pace.PerSecond(10).WithBurst(1), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer quick.Close()
	for range 2 { // the first opens the key's rate, the second, one request after, halves it
		if resp, err := (&http.Client{Transport: &pace.Transport{Limiter: quick, Key: func(*http.Request) string { return "refused" }}}).Get(refusing.URL); err == nil {
			resp.Body.Close()
		}
	}
	now, _ := c.Time(ctx).Result()
	c.ZAdd(ctx, "pace:{fleet}#default", redis.Z{Score: float64(now.Add(-400 * time.Millisecond).UnixMicro()), Member: "host-a:1:aa"},
		redis.Z{Score: float64(now.Add(-1200 * time.Millisecond).UnixMicro()), Member: "host-b:2:bb"})

	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-redis", "redis://" + srv.Addr}, &out, &out); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	t.Logf("\n%s", report)
	for _, want := range []string{
		"pace:{api}", "bucket", "schedule booked until in ", // a minute ahead when booked
		"pace:{held}#hold", "held until in 2", // 30 s, less the time since
		"pace:{deploy}#limits", "the fleet paces it at one every 1m0s, burst 1 (it lapses in ", "another process asks one every 1s, burst 1", "they disagree",
		"pace:{deploy}#differ", "the fleet paces the key at different limits",
		"pace:{refused}#rate", "cut to 50.0% of the configured rate", "what the upstream was found to accept",
		"pace:{search}:5/m sliding", "sliding window", "3 grants kept, the oldest",
		"pace:{tts}#slots:4 in flight", `slots of "4 in flight"`, "1 held, leases end in ",
		"pace:{fleet}#default", `2 members: "host-a:1:aa", last heartbeat `, `; "host-b:2:bb", last heartbeat `,
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	// A lease of 3 s, renewed while held (once maybe after the report's
	// clock was read): its end 2 s to 3.1 s away.
	lease := regexp.MustCompile(`leases end in ([0-9.]+)s`).FindStringSubmatch(report)
	if end, err := strconv.ParseFloat(cmp.Or(append(lease, "", "")[1], "x"), 64); err != nil || end < 2 || end > 3.1 {
		t.Errorf("the report's lease ends in %v, want 2 s to 3.1 s", lease)
	}
	// The heartbeats' ages, 400 ms and 1.2 s when written, and what the
	// inspection took since.
	took := time.Since(now)
	for member, age := range map[string]time.Duration{"host-a:1:aa": 400 * time.Millisecond, "host-b:2:bb": 1200 * time.Millisecond} {
		m := regexp.MustCompile(regexp.QuoteMeta(strconv.Quote(member)) + `, last heartbeat (\S+) ago`).FindStringSubmatch(report)
		if m == nil {
			t.Errorf("the report says no heartbeat of %s", member)
			continue
		}
		if d, err := time.ParseDuration(m[1]); err != nil || d < age || d > age+took {
			t.Errorf("%s: last heartbeat %s ago, want %v to %v", member, m[1], age, age+took)
		}
	}
	out.Reset()
	if err := run(ctx, []string{"inspect", "-redis", "redis://" + srv.Addr, "search"}, &out, &out); err != nil || strings.Contains(out.String(), "{api}") || !strings.Contains(out.String(), "{search}") {
		t.Errorf("inspect search: %v\n%s\nwant the key search alone", err, out.String())
	}
}

// TestUsage: -h prints the usage; bad commands and flags are errors that
// name them.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"inspect", "-h"}, &out, &out); !strings.Contains(out.String(), "pace inspect -redis URL") {
		t.Errorf("inspect -h: %v, printed %q", err, out.String())
	}
	for args, want := range map[string]string{
		"":                                "want a command",
		"list":                            "want a command",
		"inspect":                         "want one of -redis URL and -cluster",
		"inspect -redis nope://x":         `-redis "nope://x"`,
		"watch -redis redis://x -every 0": "-every 0s",
	} {
		err := run(context.Background(), strings.Fields(args), &out, &out)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("pace %s: %v, want an error with %q", args, err, want)
		}
	}
}

// TestInspectCluster: on a real three-node Redis Cluster, keys whose hash
// tags fall on different masters are all found.
func TestInspectCluster(t *testing.T) {
	ctx := context.Background()
	cluster := redistest.StartCluster(t)
	c := cluster.Client(t)
	r, err := pace.NewRedis(c, pace.PerSecond(1).WithBurst(1), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	keys := []string{"a", "b", "c", "d", "e", "f"} // over the three masters' slots
	masters := map[string]bool{}
	for _, k := range keys {
		if err := r.Wait(ctx, k, 1); err != nil {
			t.Fatal(err)
		}
		node, err := c.MasterForKey(ctx, "pace:{"+k+"}")
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-cluster", strings.Join(cluster.Addrs, ",")}, &out, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("keys on %d masters:\n%s", len(masters), out.String())
	for _, k := range keys {
		if !strings.Contains(out.String(), `"pace:{`+k+`}" `) {
			t.Errorf("the report has no key %s", k)
		}
	}
	if len(masters) < 2 {
		t.Errorf("the keys fell on %d masters, want several", len(masters))
	}
}

// TestInspectHostileData: data that is not pace's, at pace's keys, is
// reported on its own key's line while the report goes on: an empty
// string where a bucket is (it panicked), a wrong type at a hold, slots,
// a line's end, gaps and a fleet (each aborted the whole report with
// WRONGTYPE), a key gone between the scan and the read (it aborted with
// redis: nil); key names that hold ESC, BEL, CR and LF are quoted, and
// forge no line.
func TestInspectHostileData(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	forged := "pace:{evil\x1b[2J\a\r\nforged 0 keys}"
	for key, value := range map[string]string{"pace:{odd}": "", "pace:{k}#slots:4 in flight": "x", "pace:{k}#gaps": "x", "pace:{fleet}#default": "x", forged: "1"} {
		c.Set(ctx, key, value, 0)
	}
	c.RPush(ctx, "pace:{k}#hold", "x")
	c.HSet(ctx, "pace:{k}#deferred", "a", "b")
	c.Set(ctx, "pace:{zz}", "1", 0) // sorted last: the report reaches it

	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-redis", "redis://" + srv.Addr}, &out, &out); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
	report := out.String()
	t.Logf("\n%s", report)
	for _, want := range []string{
		`"pace:{odd}"`, `"", not pace's`,
		`"pace:{k}#hold"`, "a list, where pace keeps a string: not pace's",
		`"pace:{k}#slots:4 in flight"`, "a string, where pace keeps a zset: not pace's",
		`"pace:{k}#deferred"`, "a hash, where pace keeps a string",
		`"pace:{fleet}#default"`,
		`"pace:{evil\x1b[2J\a\r\nforged 0 keys}"`,
		`"pace:{zz}"`,
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	if strings.ContainsAny(report, "\x1b\a\r") || strings.Contains(report, "\nforged") {
		t.Errorf("the report holds a key's control characters raw")
	}
	parts, err := readParts(ctx, c, "pace:", []string{"pace:{gone}"}, limits{}, time.Now())
	if err != nil || len(parts) != 1 || !strings.Contains(parts[0].state, "gone") {
		t.Errorf("a key gone before its read: %+v, %v; want its line to say it is gone", parts, err)
	}
}

// TestInspectBounded: over 100,000 keys, one of them a sliding window of
// 200,000 grants (whose whole read blocked Redis 205-216 ms), inspect
// finishes within 20 s, and Redis's SLOWLOG (threshold 10 ms) is empty
// after it: no command it sent took 10 ms.
func TestInspectBounded(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	for start := 0; start < 100000; start += 10000 {
		pipe := c.Pipeline()
		for i := start; i < start+10000; i++ {
			pipe.Set(ctx, "pace:{host-"+strconv.Itoa(i)+".example.com:443}", "1780000000000000", 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for start := 0; start < 200000; start += 20000 {
		grants := make([]redis.Z, 20000)
		for i := range grants {
			grants[i] = redis.Z{Score: float64(1780000000000000 + start + i), Member: "grant-" + strconv.Itoa(start+i)}
		}
		if err := c.ZAdd(ctx, "pace:{big}:5/m sliding", grants...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c.ConfigSet(ctx, "slowlog-log-slower-than", "10000")
	c.SlowLogReset(ctx)
	var out bytes.Buffer
	began := time.Now()
	if err := run(ctx, []string{"inspect", "-redis", "redis://" + srv.Addr}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	slow, err := c.Do(ctx, "SLOWLOG", "GET", 10).Slice()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("inspect of 100,001 keys: %v, %d bytes of report, %d slow commands", took, out.Len(), len(slow))
	if took > 20*time.Second {
		t.Errorf("inspect took %v, want under 20s", took)
	}
	if len(slow) > 0 {
		t.Errorf("SLOWLOG after inspect: %v, want it empty", slow)
	}
	if !strings.Contains(out.String(), "200000 grants kept") || !strings.Contains(out.String(), "100001 keys") {
		t.Errorf("the report counts no 200000 grants, or not 100001 keys")
	}
}

// TestInspectFindsRulesAndResets: inspect and watch find a rule's keys by
// the rule's name and by its host, with or without the port (watch github
// found 0 keys: it needed the hashed key); a key's settled marks are one
// line that counts them (one line each before); -json writes the report
// for scripts; reset lists what it would unlink and unlinks nothing
// without -yes, unlinks with it, and prints its usage with -h.
func TestInspectFindsRulesAndResets(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	// Slow limits: a unit takes seconds to refill, so that no key is full
	// again, and gone, before the test has looked at it (at 1000/s, a key
	// booked in a second's last milliseconds expired with that second).
	r, err := pace.NewRedis(c, pace.AllOf(pace.PerMinute(6).Named("requests"), pace.PerMinute(60).WithBurst(1000).Named("tokens")), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const ruleKey = "github|api.github.com:443|9f86d081884c7d659a2feaa0c55ad015"
	if err := r.Wait(ctx, ruleKey, 1); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		res, err := r.Reserve(ctx, "llm", pace.Costs{"tokens": 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(ctx, res, pace.Costs{"tokens": 5}); err != nil {
			t.Fatal(err)
		}
	}
	inspectOf := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, append([]string{"inspect", "-redis", "redis://" + srv.Addr}, args...), &out, &out); err != nil {
			t.Fatalf("inspect %v: %v", args, err)
		}
		return out.String()
	}
	for _, k := range []string{"github", "api.github.com", "api.github.com:443", ruleKey} {
		if report := inspectOf(k); !strings.Contains(report, `"`+ruleKey+`"`) || strings.Contains(report, "llm") {
			t.Errorf("inspect %s:\n%s\nwant the rule's key alone", k, report)
		}
	}
	if report := inspectOf("gitlab"); !strings.Contains(report, " 0 keys") {
		t.Errorf("inspect gitlab:\n%s\nwant no key", report)
	}
	if report := inspectOf("llm"); strings.Count(report, "#settled:") != 1 || !strings.Contains(report, "5 settled reservations' marks") {
		t.Errorf("inspect llm:\n%s\nwant one line that counts 5 settled marks", report)
	}
	var parsed struct {
		Keys []struct{ Key, Kind string } `json:"keys"`
	}
	if err := json.Unmarshal([]byte(inspectOf("-json", "github")), &parsed); err != nil || len(parsed.Keys) == 0 || parsed.Keys[0].Key != ruleKey {
		t.Errorf("inspect -json github: %+v, %v; want the rule's key", parsed, err)
	}

	var out bytes.Buffer
	if err := run(ctx, []string{"reset", "-redis", "redis://" + srv.Addr, "github"}, &out, &out); err != nil || !strings.Contains(out.String(), "would unlink 2 Redis keys") {
		t.Errorf("reset without -yes: %v\n%s\nwant a list of the 2 keys it would unlink", err, out.String())
	}
	if report := inspectOf("github"); !strings.Contains(report, " 2 keys") {
		t.Errorf("after reset without -yes:\n%s\nwant both keys still there", report)
	}
	out.Reset()
	if err := run(ctx, []string{"reset", "-redis", "redis://" + srv.Addr, "-yes", "github"}, &out, &out); err != nil || !strings.Contains(out.String(), "unlinked 2 Redis keys") {
		t.Errorf("reset -yes: %v\n%s", err, out.String())
	}
	if report := inspectOf(); strings.Contains(report, "github") || !strings.Contains(report, "llm") {
		t.Errorf("after reset -yes github:\n%s\nwant llm's keys alone", report)
	}
	out.Reset()
	if err := run(ctx, []string{"reset", "-h"}, &out, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "pace reset -redis URL") || !strings.Contains(out.String(), "-yes") {
		t.Errorf("reset -h: %v\n%s\nwant its usage", err, out.String())
	}
	if err := run(ctx, []string{"reset", "-redis", "redis://" + srv.Addr}, &out, &out); err == nil || !strings.Contains(err.Error(), "name the keys") {
		t.Errorf("reset of no key: %v, want an error", err)
	}
}

// TestInspectSaysWhatIsLeft: told a key's limit (-limit TEXT for a quota of
// one unnamed bucket, NAME=TEXT for a named one), or reading it from the
// key's name (an AllOf's unnamed limits), inspect says how much is left
// now and how long a new request would wait: for a bucket, a sliding
// window, a fixed window and a calendar's day (with when its window
// resets), some of them full.
func TestInspectSaysWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	la, err := time.LoadLocation("America/Los_Angeles")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	c := srv.Client(t)
	for _, tc := range []struct {
		quota pace.Quota
		key   string
		waits int
	}{
		{pace.PerSecond(10).WithBurst(5), "api", 3},
		{pace.AllOf(pace.Window(5, time.Minute), pace.FixedWindow(10, time.Hour)), "search", 5},
		{pace.AllOf(pace.PerSecond(100).Named("requests"), pace.PerMinute(1000).WithBurst(1000).Named("tokens")), "llm", 4},
		{pace.AllOf(pace.PerSecond(100), pace.Daily(3, la)), "gemini", 3},
	} {
		r, err := pace.NewRedis(c, tc.quota, pace.WithFleetSize(1))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for range tc.waits {
			if err := r.Wait(ctx, tc.key, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-redis", "redis://" + srv.Addr, "-limit", "10/s burst 5", "-limit", "tokens=1000/m burst 1000"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	t.Logf("\n%s", report)
	_, hour := pace.FixedWindow(10, time.Hour).Window(time.Now())
	hour = hour.UTC()
	_, midnight := pace.Daily(3, la).Window(time.Now())
	midnight = midnight.In(la)
	for _, want := range []string{
		"limit 10/s burst 5: 2 of 5 tokens left, a new request waits 0s",
		"limit 5/m sliding: 0 of 5 left, a new request waits 59.9",
		"limit 10/h fixed: 5 of 10 left in this window, which resets at " + hour.Format(time.RFC3339) + ", a new request waits 0s",
		"limit 3/day in America/Los_Angeles: 0 of 3 left in this window, which resets at " + midnight.Format(time.RFC3339) + ", a new request waits ",
		"limit 1000/m: 996 of 1000 tokens left, a new request waits 0s",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	if strings.Contains(report, "resets at "+midnight.Format(time.RFC3339)+", a new request waits 0s") {
		t.Errorf("a spent day's new request waits 0s")
	}
	if err := run(ctx, []string{"inspect", "-redis", "redis://" + srv.Addr, "-limit", "10/x"}, &out, &out); err == nil || !strings.Contains(err.Error(), "10/x") {
		t.Errorf("-limit 10/x: %v, want an error that names it", err)
	}
}
