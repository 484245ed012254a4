package main

import (
	"fmt"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/exampleproc"
)

// run starts the store, the upstream and the worker processes, waits for
// them, writes the plot if asked, and returns what they achieved.
func run(c config) (summary, error) {
	limit, _ := pace.ParseLimit(c.Limit)
	start := time.Now().Add(time.Second) // time for the processes to start
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
	target, up := c.Target, (*upstream)(nil)
	var err error
	if target == "" {
		var retryAt time.Time
		if c.RetryAfter {
			retryAt = start.Add(c.Duration / 3)
		}
		if up, err = startUpstream(limit, retryAt); err != nil {
			return summary{}, err
		}
		defer up.close()
		target = "http://" + up.addr + "/"
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
	return summarize(c, limit, reports), nil
}

// progress writes a line on stderr while the fleet runs, until done.
func progress(c config, start time.Time, up *upstream, done <-chan struct{}) {
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
				line += fmt.Sprintf(", %.0f req/s so far, %d refused", float64(up.served.Load())/elapsed.Seconds(), up.refused.Load())
			}
			fmt.Fprint(os.Stderr, "\r\033[K"+line)
		}
	}
}
