package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/redistest"
)

// BenchmarkServe sends requests at 2,000 a second to a loopback upstream:
// directly, through httputil.ReverseProxy alone, through pace serve on a
// real redis-server, and, for pace's own Redis call, a limiter's Wait
// alone. Each reports its latency's p50 and p99 in µs; pace serve's
// overhead is its p99 less ReverseProxy's and the Wait's.
func BenchmarkServe(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer upstream.Close()
	redisServer := redistest.Start(b)
	target, _ := url.Parse(upstream.URL)
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, Transport: upstreamBase()})
	defer proxy.Close()
	_, serveURL := startServe(b, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: bench, upstream: '%s', limit: 1000000/s}\n", redisServer.Addr, upstream.URL))
	client := &http.Client{Transport: upstreamBase()}
	get := func(url string) func() error {
		return func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
	}
	limiter, err := pace.NewRedis(redisServer.Client(b), pace.PerSecond(1000000))
	if err != nil {
		b.Fatal(err)
	}
	defer limiter.Close()
	for _, run := range []struct {
		name string
		send func() error
	}{
		{"direct", get(upstream.URL + "/")},
		{"reverseproxy", get(proxy.URL + "/")},
		{"serve", get(serveURL + "/")},
		{"wait", func() error { return limiter.Wait(context.Background(), "bench", 1) }},
	} {
		b.Run(run.name, func(b *testing.B) { atRate(b, 2000, run.send) })
	}
}

// atRate calls send b.N times at rate a second, each in a goroutine of
// its own, and reports the rate it kept and the p50 and p99 of their
// latencies.
func atRate(b *testing.B, rate int, send func() error) {
	b.ReportAllocs()
	latencies := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	b.ResetTimer()
	began := time.Now()
	for i := range b.N {
		time.Sleep(time.Until(began.Add(time.Duration(i) * interval)))
		wg.Go(func() {
			start := time.Now()
			if err := send(); err != nil {
				b.Error(err)
			}
			latencies[i] = time.Since(start)
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "req/s")
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[b.N/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(latencies[b.N*99/100].Microseconds()), "p99-µs")
}

// BenchmarkFirstByte measures the time to the first event of an SSE
// stream, directly and through pace serve.
func BenchmarkFirstByte(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer upstream.Close()
	redisServer := redistest.Start(b)
	_, serveURL := startServe(b, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: bench, upstream: '%s', limit: 1000000/s}\n", redisServer.Addr, upstream.URL))
	client := &http.Client{Transport: upstreamBase()}
	for _, run := range []struct{ name, url string }{{"direct", upstream.URL}, {"serve", serveURL}} {
		b.Run(run.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, "GET", run.url+"/", nil)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
					b.Fatal(err)
				}
				cancel()
				resp.Body.Close()
			}
		})
	}
}
