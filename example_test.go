package pace_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace"
	"github.com/redis/go-redis/v9"
)

// A client paced in one process: 20 requests a second with bursts of 2. Six
// requests take at least 200 ms: two at once, then one every 50 ms.
func ExampleTransport() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer upstream.Close()

	var waited atomic.Int64
	limiter, err := pace.NewLocal(pace.PerSecond(20).WithBurst(2), pace.WithObserver(func(_ context.Context, e pace.Event) {
		if e.Kind == pace.EventWait && e.Delay > 0 {
			waited.Add(1)
		}
	}))
	if err != nil {
		log.Fatal(err)
	}
	transport := &pace.Transport{Limiter: limiter}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	start := time.Now()
	for range 6 {
		resp, err := client.Get(upstream.URL)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	fmt.Println("requests that waited:", waited.Load())
	fmt.Println("took at least 200ms:", time.Since(start) >= 200*time.Millisecond)
	// Output:
	// requests that waited: 4
	// took at least 200ms: true
}

// The whole fleet shares one quota: every process that runs this, against
// the same Redis, draws on one bucket per upstream host. (This example needs
// a Redis on localhost:6379, so it is compiled but not run by go test.)
func ExampleNewRedis() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	limiter, err := pace.NewRedis(rdb, pace.PerHour(5000))
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close()
	client := &http.Client{Transport: &pace.Transport{Limiter: limiter}}

	// A request waits for its token; if it cannot be had within the
	// request's deadline, it fails at once with a *pace.DeadlineError.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.github.com/rate_limit", nil)
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
}

func ExampleParseLimit() {
	for _, s := range []string{"100/s", "5000/h", "900/15m", "10/s burst 20", "fast"} {
		l, err := pace.ParseLimit(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%-14s %8.3f/s, burst %d\n", l, l.Rate(), l.Burst())
	}
	// Output:
	// 100/s           100.000/s, burst 100
	// 5000/h            1.389/s, burst 5000
	// 900/15m           1.000/s, burst 900
	// 10/s burst 20    10.000/s, burst 20
	// pace: invalid limit "fast": no '/' (want COUNT/PERIOD [burst N], such as "100/s", "100 per minute", "900 per 15 minutes" or "10/s burst 20")
}

// Rules for four APIs' quotas: GitHub's 5,000 an hour per token, X's 900
// per 15 minutes per endpoint, Shopify's bucket of 40 leaking 2 a second,
// and Stripe's 100 a second per account with 25 a second per endpoint.
// (This example needs a Redis on localhost:6379, so it is compiled but not
// run by go test.)
func ExampleNewRules() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	limiter := func(q pace.Quota) pace.Limiter {
		l, err := pace.NewRedis(rdb, q)
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	account := pace.PerSecond(100).Named("account") // one bucket per Stripe account, shared by its endpoints
	rules, err := pace.NewRules(pace.Rule{Name: "default", Unlimited: true},
		pace.Rule{Name: "github", Host: "api.github.com", KeyHeader: "Authorization",
			Limiter: limiter(pace.Window(5000, time.Hour))},
		pace.Rule{Name: "x-search", Host: "api.x.com", PathPrefix: "/2/tweets/search/recent",
			KeyHeader: "Authorization", Limiter: limiter(pace.Window(900, 15*time.Minute))},
		pace.Rule{Name: "shopify", PathPrefix: "/admin/api/", KeyHeader: "X-Shopify-Access-Token",
			Limiter: limiter(pace.PerSecond(2).WithBurst(40))},
		pace.Rule{Name: "stripe-charges", Key: "stripe", Host: "api.stripe.com", PathPrefix: "/v1/charges",
			KeyHeader: "Authorization", Limiter: limiter(pace.AllOf(account, pace.PerSecond(25).Named("charges")))},
		pace.Rule{Name: "stripe-other", Key: "stripe", Host: "api.stripe.com",
			KeyHeader: "Authorization", Limiter: limiter(pace.AllOf(account, pace.PerSecond(25).Named("other")))},
	)
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: &pace.Transport{Rules: rules}}
	resp, err := client.Get("https://api.github.com/rate_limit")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
}

// An LLM API's quota of requests and tokens a minute, each request reserved
// at its estimate (its prompt and its max_tokens) and settled at the usage
// its answer reports, once the body has been read.
func ExampleOpenAIUsage() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[{"message":{"content":"Hi!"}}],"usage":{"prompt_tokens":20,"completion_tokens":100,"total_tokens":120}}`)
	}))
	defer upstream.Close()

	limiter, err := pace.NewLocal(pace.AllOf(pace.PerMinute(500).Named("requests"), pace.PerMinute(1000).Named("tokens")))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: &pace.Transport{
		Limiter: limiter,
		// In a real client, read the prompt and max_tokens from the body
		// (req.GetBody leaves the request as it is).
		Estimate: func(*http.Request) pace.Costs { return pace.Costs{"tokens": 20 + 380} },
		Settle:   pace.OpenAIUsage("tokens"),
	}}
	resp, err := client.Post(upstream.URL, "application/json", strings.NewReader(`{"max_tokens":380}`))
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) // at EOF, the reservation is settled: 120 tokens, not 400
	resp.Body.Close()

	// 880 tokens are left of the minute's 1,000 (at the estimate, 600 would
	// be): a request estimated at 880 goes at once, and then one more waits.
	key := upstream.Listener.Addr().String() // the Transport's key: the host and port
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err = limiter.Reserve(ctx, key, pace.Costs{"tokens": 880})
	fmt.Println("880 more tokens go at once:", err == nil)
	_, err = limiter.Reserve(ctx, key, pace.Costs{"tokens": 1})
	fmt.Println("then one more token waits:", err != nil)
	// Output:
	// 880 more tokens go at once: true
	// then one more token waits: true
}
