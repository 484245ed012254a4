package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fleetpace/pace"
)

// api imitates an OpenAI-compatible chat/completions endpoint that enforces
// requests and tokens per minute the way LLM APIs do: a request is charged
// its prompt and its max_tokens when it arrives, refused with a 429 when
// either bucket lacks them, and its count corrected to what it used when its
// answer ends. An answer uses from 30% to 100% of max_tokens, takes from 50
// to 150 ms, and comes whole or, when asked, as a stream of server-sent
// events, with its usage in the last chunk.
type api struct {
	mu               sync.Mutex
	requests, tokens bucket
	served, tooMany  int
	tokensUsed       int
	start, end       time.Time // requests that arrive outside are not counted
}

// chatRequest is what the API reads of a request.
type chatRequest struct {
	Messages      []struct{ Content string } `json:"messages"`
	MaxTokens     int                        `json:"max_tokens"`
	Stream        bool                       `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// estimate is what the request is charged when it arrives: its prompt and
// its max_tokens.
func (r chatRequest) estimate() (prompt, total int) {
	for _, m := range r.Messages {
		prompt += promptTokens(m.Content)
	}
	return prompt, prompt + r.MaxTokens
}

// promptTokens is how many tokens a prompt counts for, here and in the
// workers' estimate: a token for every 4 bytes, rounded up.
func promptTokens(text string) int { return (len(text) + 3) / 4 }

func newAPI(requests, tokens pace.Limit, start, end time.Time) *api {
	// A token of slack for requests and one request's worth for tokens: the
	// jitter between a grant and its arrival here could otherwise cost a 429.
	return &api{
		requests: newBucket(requests, 1, start),
		tokens:   newBucket(tokens, maxMaxTokens+maxPromptBytes/4, start),
		start:    start, end: end,
	}
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.MaxTokens < 1 {
		http.Error(w, `{"error":{"message":"a chat request with max_tokens, please"}}`, http.StatusBadRequest)
		return
	}
	prompt, estimate := req.estimate()
	// What the answer will use is settled as it is accepted, and counted
	// then: an answer the end of the run cuts short has used its tokens too.
	completion := max(1, int(float64(req.MaxTokens)*(0.3+0.7*rand.Float64())))
	now := time.Now()
	a.mu.Lock()
	ok := a.requests.has(now, 1) && a.tokens.has(now, estimate)
	counted := !now.Before(a.start) && now.Before(a.end)
	if ok {
		a.requests.take(1)
		a.tokens.take(estimate)
		if counted {
			a.served++
			a.tokensUsed += prompt + completion
		}
	} else if counted {
		a.tooMany++
	}
	a.header(w.Header(), now)
	a.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	answer(w, req, prompt, completion, time.Duration(50+rand.IntN(100))*time.Millisecond)
	a.mu.Lock()
	a.tokens.give(time.Now(), estimate-prompt-completion) // the count corrected to what it used
	a.mu.Unlock()
}

// header sets the OpenAI-style x-ratelimit headers of what is left. The
// caller holds a.mu.
func (a *api) header(h http.Header, now time.Time) {
	for name, b := range map[string]*bucket{"requests": &a.requests, "tokens": &a.tokens} {
		h.Set("x-ratelimit-limit-"+name, strconv.Itoa(int(b.burst)))
		h.Set("x-ratelimit-remaining-"+name, strconv.Itoa(int(b.level)))
		h.Set("x-ratelimit-reset-"+name, b.untilFull(now).Round(time.Millisecond).String())
	}
}

// answer writes the completion: whole, or as a stream of chunks over
// took, with the usage last when the request asked for it.
func answer(w http.ResponseWriter, req chatRequest, prompt, completion int, took time.Duration) {
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
	if !req.Stream {
		time.Sleep(took)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"loopback","choices":[{"index":0,"message":{"role":"assistant","content":"%d tokens of answer"},"finish_reason":"stop"}],"usage":%s}`, completion, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	const chunks = 5
	for i := range chunks {
		time.Sleep(took / chunks)
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"part %d \"},\"finish_reason\":null}],\"usage\":null}\n\n", i)
		w.(http.Flusher).Flush()
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// counts returns what the API served, refused and used, of the requests
// that arrived within the run.
func (a *api) counts() (served, tooMany, tokensUsed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.served, a.tooMany, a.tokensUsed
}

// bucket is a token bucket that can take back what it charged.
type bucket struct {
	rate, burst, level float64
	last               time.Time
}

func newBucket(l pace.Limit, slack float64, start time.Time) bucket {
	b := float64(l.Burst()) + slack
	return bucket{rate: l.Rate(), burst: b, level: b, last: start}
}

// has refills the bucket to now and reports whether it holds n.
func (b *bucket) has(now time.Time, n int) bool {
	if now.After(b.last) {
		b.level = min(b.burst, b.level+b.rate*now.Sub(b.last).Seconds())
		b.last = now
	}
	return b.level >= float64(n)
}

func (b *bucket) take(n int) { b.level -= float64(n) }

// give puts n back, up to full.
func (b *bucket) give(now time.Time, n int) {
	b.has(now, 0)
	b.level = min(b.burst, b.level+float64(n))
}

func (b *bucket) untilFull(now time.Time) time.Duration {
	b.has(now, 0)
	return time.Duration((b.burst - b.level) / b.rate * float64(time.Second))
}
