// Command apiclient is an API client that keeps to an hourly quota and
// retries through go-retryablehttp: every attempt waits for its token, and
// when the API answers 429 with Retry-After, the client (and every other
// process sharing the Redis) holds off for that long, then goes on.
//
//	go run ./examples/apiclient                 # a loopback API and an embedded store
//	go run ./examples/apiclient -redis redis://127.0.0.1:6379/0 -url https://api.example.com/v1/items
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/examplestore"
)

func main() {
	redisURL := flag.String("redis", "", "Redis URL (default: an embedded store)")
	url := flag.String("url", "", "the API endpoint to POST to (default: one on loopback that answers one 429)")
	quota := flag.String("quota", "36000/h burst 5", "the API's quota, as pace.ParseLimit reads it")
	n := flag.Int("n", 12, "requests to send")
	flag.Parse()
	if err := call(os.Stdout, *redisURL, *url, *quota, *n); err != nil {
		fmt.Fprintln(os.Stderr, "apiclient:", err)
		os.Exit(1)
	}
}

func call(out io.Writer, redisURL, url, quota string, n int) error {
	limit, err := pace.ParseLimit(quota)
	if err != nil {
		return err
	}
	if url == "" {
		var calls atomic.Int64
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 8 { // once: slow down
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		defer api.Close()
		url = api.URL + "/v1/items"
	}
	limiter, closeLimiter, err := examplestore.Limiter(redisURL, limit)
	if err != nil {
		return err
	}
	defer closeLimiter()
	transport := &pace.Transport{Limiter: limiter}
	defer transport.CloseIdleConnections()
	client := pace.NewRetryClient(transport)

	start := time.Now()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(fmt.Sprintf(`{"item": %d}`, i)))
		if err != nil {
			cancel()
			return err
		}
		resp, err := client.Do(req)
		cancel()
		if err != nil {
			return err
		}
		resp.Body.Close()
		fmt.Fprintf(out, "item %2d: %d after %v\n", i, resp.StatusCode, time.Since(start).Round(time.Millisecond))
	}
	return nil
}
