// Command batch runs a job over a list of items against a quota, with a
// progress bar whose ETA comes from the limit: at most the burst at once,
// then the rate, so the remaining items take remaining/rate.
//
//	go run ./examples/batch                       # 60 items at 20/s on a loopback API
//	go run ./examples/batch -redis redis://127.0.0.1:6379/0 -items 5000 -limit 100/s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/examplestore"
)

func main() {
	redisURL := flag.String("redis", "", "Redis URL (default: an embedded store)")
	items := flag.Int("items", 60, "items to process")
	limitText := flag.String("limit", "20/s burst 5", "the API's quota, as pace.ParseLimit reads it")
	workers := flag.Int("workers", 4, "concurrent requests")
	flag.Parse()
	if err := batch(os.Stderr, *redisURL, *limitText, *items, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "batch:", err)
		os.Exit(1)
	}
}

func batch(out io.Writer, redisURL, limitText string, items, workers int) error {
	limit, err := pace.ParseLimit(limitText)
	if err != nil {
		return err
	}
	limiter, closeLimiter, err := examplestore.Limiter(redisURL, limit)
	if err != nil {
		return err
	}
	defer closeLimiter()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer api.Close()
	transport := &pace.Transport{Limiter: limiter}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	queue := make(chan int)
	var done atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		wg.Go(func() {
			for item := range queue {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, fmt.Sprintf("%s/items/%d", api.URL, item), nil)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
				} else {
					resp.Body.Close()
				}
				done.Add(1)
			}
		})
	}
	start := time.Now()
	stop := make(chan struct{})
	go func() {
		for i := range items {
			queue <- i
		}
		close(queue)
		wg.Wait()
		close(stop)
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			bar(out, items, items, start, limit)
			fmt.Fprintf(out, "\n%d items in %v, %d failed\n", items, time.Since(start).Round(10*time.Millisecond), failed.Load())
			return nil
		case <-tick.C:
			bar(out, int(done.Load()), items, start, limit)
		}
	}
}

// bar draws the progress bar and an ETA from the limit: the items left, at
// the limit's rate (the burst is spent by then, but at the start).
func bar(out io.Writer, done, total int, start time.Time, limit pace.Limit) {
	const width = 30
	filled := width * done / total
	left := float64(total - done)
	if done == 0 {
		left -= float64(limit.Burst())
	}
	eta := time.Duration(max(left, 0) / limit.Rate() * float64(time.Second)).Round(100 * time.Millisecond)
	fmt.Fprintf(out, "\r[%s%s] %d/%d  %v elapsed, ETA %v ", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total,
		time.Since(start).Round(100*time.Millisecond), eta)
}
