package main

import (
	"fmt"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/exampleproc"
	"github.com/fleetpace/pace/internal/quotaapi"
)

// run starts the store, the upstream and the worker processes, waits for
// them, writes the plot if asked, and returns what they achieved.
func run(c config) (summary, error) {
	limit, _ := pace.ParseLimit(c.Limit)
	// Time for the processes to start; a whole second, as GitHub's resets are.
	start := time.Now().Add(2 * time.Second).Truncate(time.Second)
	var store *miniredis.Miniredis
	redisURL := c.Redis
	if redisURL == "" && !c.Local {
		store = miniredis.NewMiniRedis()
		if err := store.StartAddr("127.0.0.1:0"); err != nil {
			return summary{}, err
		}
		defer store.Close()
		redisURL = "redis://" + store.Addr()
	}
	target, up := c.Target, (*quotaapi.Server)(nil)
	var err error
	if target == "" {
		if up, err = startUpstream(c, limit, start); err != nil {
			return summary{}, err
		}
		defer up.Close()
		target = up.URL()
	}

	var jobs []job
	for i := range c.Procs {
		jobs = append(jobs, job{Config: c, Index: i, Redis: redisURL, Target: target, Start: start})
	}
	wait, err := exampleproc.Start[job, report](workerEnv, jobs)
	if err != nil {
		return summary{}, err
	}
	var reports []report
	done := make(chan struct{})
	go func() {
		reports, err = wait()
		close(done)
	}()
	if store != nil && c.KillRedis > 0 {
		time.AfterFunc(time.Until(start.Add(c.KillRedis)), func() {
			store.Close()
			time.AfterFunc(time.Second, func() { store.Restart() })
		})
	}
	progress(c, start, up, done)
	if err != nil {
		return summary{}, err
	}
	if c.Plot != "" {
		if err := os.WriteFile(c.Plot, plot(c, limit, start, reports), 0o644); err != nil {
			return summary{}, err
		}
	}
	var foreign quotaapi.Counts
	if up != nil {
		foreign = up.Counts()
	}
	return summarize(c, limit, start, reports, foreign), nil
}

// progress writes a line on stderr while the fleet runs, until done.
func progress(c config, start time.Time, up *quotaapi.Server, done <-chan struct{}) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if !c.JSON {
				fmt.Fprint(os.Stderr, "\r\033[K")
			}
			return
		case <-tick.C:
			if c.JSON || time.Since(start) < 100*time.Millisecond {
				continue
			}
			elapsed := time.Since(start).Truncate(100 * time.Millisecond)
			line := fmt.Sprintf("elapsed %v of %v", elapsed, c.Duration)
			if up != nil {
				n := up.Counts()
				line += fmt.Sprintf(", %.0f req/s so far, %d refused", float64(n.OK)/elapsed.Seconds(), n.Refused)
			}
			fmt.Fprint(os.Stderr, "\r\033[K"+line)
		}
	}
}
