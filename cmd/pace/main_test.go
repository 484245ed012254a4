package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
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
	if err := booked.Wait(ctx, "api", 1); err != nil { // the schedule is a second ahead
		t.Fatal(err)
	}
	if err := booked.Hold(ctx, "held", pace.Hold{For: 30 * time.Second, Reason: "test"}); err != nil {
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
	if resp, err := (&http.Client{Transport: &pace.Transport{Limiter: booked, Key: func(*http.Request) string { return "refused" }}}).Get(refusing.URL); err == nil {
		resp.Body.Close()
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
		"pace:{api}", "bucket", "schedule booked until in 9", // a second ahead, less the time since
		"pace:{held}#hold", "held until in 29.9",
		"pace:{refused}#rate", "cut to 70.0% of the configured rate", "climbing to 3% below 100.0%",
		"pace:{search}:5/m sliding", "sliding window", "3 grants kept, the oldest",
		"pace:{tts}#slots:4 in flight", "1 held, leases end in 2.9",
		"pace:{fleet}#default", "2 members: host-b:2:bb, last heartbeat 1.2", "host-a:1:aa, last heartbeat 40",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report has no %q", want)
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
		if !strings.Contains(out.String(), "pace:{"+k+"} ") {
			t.Errorf("the report has no key %s", k)
		}
	}
	if len(masters) < 2 {
		t.Errorf("the keys fell on %d masters, want several", len(masters))
	}
}
