// Command crawler fetches pages from several hosts with per-host politeness
// that holds across every process of a crawl fleet: each host gets its own
// bucket in Redis, so ten crawler processes together still send a host no
// more than -per-host requests a second.
//
//	go run ./examples/crawler                              # 3 loopback sites, an embedded store
//	go run ./examples/crawler -redis redis://127.0.0.1:6379/0 -urls https://a.example/,https://b.example/
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/examplestore"
)

func main() {
	redisURL := flag.String("redis", "", "Redis URL (default: an embedded store)")
	urls := flag.String("urls", "", "comma-separated start URLs (default: 3 sites on loopback)")
	perHost := flag.Float64("per-host", 5, "requests a second for each host, across the fleet")
	pages := flag.Int("pages", 10, "pages to fetch from each start URL")
	workers := flag.Int("workers", 8, "concurrent fetches")
	flag.Parse()
	if err := crawl(os.Stdout, *redisURL, *urls, *perHost, *pages, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "crawler:", err)
		os.Exit(1)
	}
}

func crawl(out io.Writer, redisURL, urls string, perHost float64, pages, workers int) error {
	var outages atomic.Int64
	limiter, closeLimiter, err := examplestore.Limiter(redisURL, pace.PerSecond(perHost).WithBurst(1), pace.WithPrefix("crawler:"),
		pace.WithObserver(func(_ context.Context, e pace.Event) {
			if e.Kind == pace.EventFallback {
				outages.Add(1)
			}
		}))
	if err != nil {
		return err
	}
	defer closeLimiter()
	transport := &pace.Transport{Limiter: limiter} // the key is the host: one bucket per site
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}

	var starts []string
	if urls != "" {
		starts = strings.Split(urls, ",")
	} else {
		for range 3 {
			site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "<html>page %s</html>", r.URL.Path)
			}))
			defer site.Close()
			starts = append(starts, site.URL+"/")
		}
	}

	type page struct{ url, host string }
	queue := make(chan page)
	var mu sync.Mutex
	fetched := map[string][]time.Time{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for p := range queue {
				resp, err := client.Get(p.url)
				if err != nil {
					fmt.Fprintln(out, "error:", err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				fetched[p.host] = append(fetched[p.host], time.Now())
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	for i := range pages {
		for _, s := range starts {
			queue <- page{url: fmt.Sprintf("%spage/%d", s, i), host: s}
		}
	}
	close(queue)
	wg.Wait()
	fmt.Fprintf(out, "%d pages from %d hosts in %v, at most %g a second each:\n", pages*len(starts), len(starts), time.Since(start).Round(10*time.Millisecond), perHost)
	if n := outages.Load(); n > 0 {
		fmt.Fprintf(out, "  (Redis failed %d times; the crawler paced locally meanwhile)\n", n)
	}
	for _, s := range starts {
		times := fetched[s]
		var last time.Duration
		if len(times) > 0 {
			last = slices.MaxFunc(times, time.Time.Compare).Sub(start)
		}
		fmt.Fprintf(out, "  %-40s %3d pages, the last %4dms after the start\n", s, len(times), last.Milliseconds())
	}
	return nil
}
