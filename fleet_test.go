package pace

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// fleetWorkerEnv, when set, makes the test binary a fleet worker: a process
// of its own, configured by the JSON fleetWorker in the variable.
const fleetWorkerEnv = "PACE_FLEET_WORKER"

// fleetWorker is what a worker process is told to do.
type fleetWorker struct {
	Addr       string // Redis
	Limit      string // in ParseLimit syntax
	Key        string
	Goroutines int
	Start, End time.Time // the same for every process of the fleet
}

// fleetReport is what a worker process prints on stdout.
type fleetReport struct {
	Grants  []time.Time
	Cancels int64
	Err     string
}

// runFleetWorker runs one fleet worker process and returns its exit code.
func runFleetWorker() int {
	var w fleetWorker
	var report fleetReport
	err := json.Unmarshal([]byte(os.Getenv(fleetWorkerEnv)), &w)
	if err == nil {
		report, err = w.run()
	}
	if err != nil {
		report.Err = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(report)
	if err != nil {
		return 1
	}
	return 0
}

func (w fleetWorker) run() (fleetReport, error) {
	limit, err := ParseLimit(w.Limit)
	if err != nil {
		return fleetReport{}, err
	}
	client := redis.NewClient(&redis.Options{Addr: w.Addr, PoolSize: w.Goroutines})
	defer client.Close()
	var cancels atomic.Int64
	r, err := NewRedis(client, limit, WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventCancel {
			cancels.Add(1)
		}
	}))
	if err != nil {
		return fleetReport{}, err
	}
	time.Sleep(time.Until(w.Start)) // line up with the other processes
	grants, err := runWorkers(w.Goroutines, w.End, func(ctx context.Context) error { return r.Wait(ctx, w.Key, 1) })
	return fleetReport{Grants: grants, Cancels: cancels.Load()}, err
}

// runFleet starts procs worker processes of this test binary, all told to do
// w, and returns their reports.
func runFleet(t *testing.T, procs int, w fleetWorker) []fleetReport {
	t.Helper()
	config, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Until(w.End)+30*time.Second)
	defer cancel()
	reports := make([]fleetReport, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fleetWorkerEnv+"="+string(config))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			runErr := cmd.Run()
			if err := json.Unmarshal(stdout.Bytes(), &reports[i]); err != nil || runErr != nil || reports[i].Err != "" {
				errs[i] = fmt.Errorf("worker %d: %v %s; stderr: %s", i, runErr, reports[i].Err, stderr.String())
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return reports
}

// TestRedisFleet: 4 processes of 8 goroutines each share one key at 200/s
// burst 10 for 3 s through one real Redis. Together they get at most
// 10 + 200*t + 1 grants over the span t they cover and at least 97% of
// 200*t, with exactly one script call per grant.
func TestRedisFleet(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	const limit = "200/s burst 10"
	warm := mustRedis(t, c, mustParseLimit(t, limit))
	if err := warm.Wait(ctx, "warm-up", 1); err != nil { // loads the script, so workers' EVALSHA finds it
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	start := time.Now().Add(time.Second) // time for the processes to start
	reports := runFleet(t, 4, fleetWorker{
		Addr: c.Options().Addr, Limit: limit, Key: "api.example.com:443",
		Goroutines: 8, Start: start, End: start.Add(3 * time.Second),
	})

	var grants []time.Time
	var cancels int64
	for i, r := range reports {
		if len(r.Grants) < 50 {
			t.Errorf("process %d got only %d grants: the fleet did not share fairly", i, len(r.Grants))
		}
		grants = append(grants, r.Grants...)
		cancels += r.Cancels
	}
	slices.SortFunc(grants, time.Time.Compare)
	checkGrants(t, grants, 200, 10)

	calls, err := redistest.CommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	scriptCalls := calls["evalsha"].Calls + calls["eval"].Calls
	t.Logf("%d script calls (evalsha %d, eval %d) for %d grants: %.2f per grant; %d refunds",
		scriptCalls, calls["evalsha"].Calls, calls["eval"].Calls, len(grants), float64(scriptCalls)/float64(len(grants)), cancels)
	if scriptCalls != int64(len(grants)) || cancels != 0 {
		t.Errorf("%d script calls and %d refunds for %d grants, want exactly one reservation call per grant and no refund",
			scriptCalls, cancels, len(grants))
	}
}

func mustParseLimit(t testing.TB, s string) Limit {
	t.Helper()
	l, err := ParseLimit(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
