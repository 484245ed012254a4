package pace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// hourlyTokens is a quota whose tokens hardly refill during a test (1,000 an
// hour): how many a key has used shows in how long 1,000 more would wait,
// 3.6 s a token.
var hourlyTokens = AllOf(PerSecond(100).Named("requests"), Per(1000, time.Hour).WithBurst(1000).Named("tokens"))

// tokensUsed returns about how many tokens key has used on lim.
func tokensUsed(t *testing.T, lim backend, key string) int {
	t.Helper()
	return int((tokensDue(t, lim, key, 1000) + 1800*time.Millisecond) / (3600 * time.Millisecond))
}

// streamServer streams the OpenAI sample's chunks, one at a time, each once
// the test says so on next (closed: all the rest at once). A test that
// ends first (a failure) ends the stream: the server's Close waits for it.
func streamServer(t *testing.T, next <-chan struct{}) *httptest.Server {
	chunks := strings.SplitAfter(apiSample(t, "openai-stream.txt"), "\n\n")
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush() // the headers, before any chunk
		for _, chunk := range chunks {
			select {
			case <-next:
			case <-ended:
				return
			}
			io.WriteString(w, chunk)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(ended) }) // cleanups run last first: before the Close
	return srv
}

// settlingClient is a client whose Transport reserves 400 tokens a request
// on lim and settles them by OpenAIUsage.
func settlingClient(lim backend) *http.Client {
	return &http.Client{Transport: &Transport{Limiter: lim, Key: func(*http.Request) string { return "llm" },
		Estimate: func(*http.Request) Costs { return Costs{"tokens": 400} }, Settle: OpenAIUsage("tokens")}}
}

// TestBodySettlesAtEOF: a streamed body read slowly, a chunk at a time,
// passes each chunk on as it comes (the server sends the next only once the
// test has read the last), and the reservation keeps its estimate until the
// body reaches EOF, when it is settled at the stream's usage: 21 tokens.
func TestBodySettlesAtEOF(t *testing.T) {
	lim := mustLocal(t, hourlyTokens)
	next := make(chan struct{})
	resp, err := settlingClient(lim).Get(streamServer(t, next).URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	for i, chunk := range strings.SplitAfter(apiSample(t, "openai-stream.txt"), "\n\n") {
		if used := tokensUsed(t, lim, "llm"); used != 400 {
			t.Fatalf("before chunk %d: %d tokens used, want the estimate, 400", i, used)
		}
		next <- struct{}{}
		var got string
		for len(got) < len(chunk) { // a chunk may come in more than one read
			n, err := resp.Body.Read(buf)
			if err != nil && err != io.EOF {
				t.Fatal(err)
			}
			got += string(buf[:n])
		}
		if got != chunk {
			t.Fatalf("chunk %d read as %q, want %q", i, got, chunk)
		}
	}
	if n, err := resp.Body.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the last chunk: %d bytes, %v; want EOF", n, err)
	}
	if used := tokensUsed(t, lim, "llm"); used != 21 {
		t.Errorf("after EOF: %d tokens used, want the stream's usage, 21", used)
	}
}

// TestBodyEndsEarly: a body closed after a tenth of the stream, and a body
// never read nor closed, keep the estimate of 400 tokens.
func TestBodyEndsEarly(t *testing.T) {
	for name, read := range map[string]func(io.ReadCloser){
		"closed after 10%": func(body io.ReadCloser) {
			io.ReadFull(body, make([]byte, len(apiSample(t, "openai-stream.txt"))/10))
			body.Close()
		},
		"never closed": func(io.ReadCloser) {},
	} {
		t.Run(name, func(t *testing.T) {
			lim := mustLocal(t, hourlyTokens)
			next := make(chan struct{})
			close(next) // the whole stream at once
			resp, err := settlingClient(lim).Get(streamServer(t, next).URL)
			if err != nil {
				t.Fatal(err)
			}
			read(resp.Body)
			if used := tokensUsed(t, lim, "llm"); used != 400 {
				t.Errorf("%d tokens used, want the estimate, 400", used)
			}
			resp.Body.Close() // the test's own clean-up
		})
	}
}

// TestCollectedBodyIsHeard: a response whose body its caller drops, never
// read to its end nor closed, keeps its reservation's estimate, and the
// observer hears it, with the key, once the body is collected: never in
// silence. A body read and closed is heard settled, not so.
func TestCollectedBodyIsHeard(t *testing.T) {
	var log eventLog
	lim := mustLocal(t, hourlyTokens, WithObserver(log.observe))
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"usage": {"total_tokens": 21}}`)
	}))
	defer upstream.Close()
	client := settlingClient(lim)
	var mu sync.Mutex
	var raw []io.Closer // the bodies beneath pace's, which the test closes at its end: net/http's connection waits on them
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range raw {
			b.Close()
		}
	}()
	client.Transport.(*Transport).Base = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			mu.Lock()
			raw = append(raw, resp.Body)
			mu.Unlock()
		}
		return resp, err
	})
	dropped := func() { // in a function of its own, so that nothing keeps the response
		if _, err := client.Get(upstream.URL); err != nil {
			t.Fatal(err)
		}
	}
	dropped()
	heard := func() (e Event, ok bool) {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, e := range log.events {
			if e.Kind == EventSettle && errors.Is(e.Err, errBodyCollected) {
				return e, true
			}
		}
		return Event{}, false
	}
	var e Event
	var ok bool
	for range 50 {
		runtime.GC()
		if e, ok = heard(); ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !ok || e.Key != "llm" || e.Estimate["tokens"] != 400 {
		t.Fatalf("a dropped body after 50 collections: heard %v (%+v); want an EventSettle of key llm, its estimate 400, errBodyCollected", ok, e)
	}
	resp, err := client.Get(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp = nil
	for range 5 {
		runtime.GC()
	}
	time.Sleep(10 * time.Millisecond)
	log.mu.Lock()
	defer log.mu.Unlock()
	n := 0
	for _, e := range log.events {
		if e.Kind == EventSettle && errors.Is(e.Err, errBodyCollected) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d bodies heard collected unended, want the dropped one alone", n)
	}
}

// TestTransportEstimateBadInput: an Estimate on a Limiter that cannot
// settle, a Settle without an Estimate, and an estimate beyond a burst are
// errors that say so, and the request goes nowhere.
func TestTransportEstimateBadInput(t *testing.T) {
	base := &countingBase{}
	lim := mustLocal(t, hourlyTokens)
	estimate := func(*http.Request) Costs { return Costs{"tokens": 400} }
	for want, tr := range map[string]*Transport{
		"Local or Redis":             {Base: base, Limiter: waitOnly{lim}, Estimate: estimate},
		"Settle without an Estimate": {Base: base, Limiter: lim, Settle: OpenAIUsage("tokens")},
		`cost 2000 under limit "tokens" exceeds its burst 1000`: {Base: base, Limiter: lim, Estimate: func(*http.Request) Costs { return Costs{"tokens": 2000} }},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://upstream/", nil)
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v, want an error containing %q", err, want)
		}
	}
	if base.calls.Load() != 0 {
		t.Errorf("%d requests reached the upstream", base.calls.Load())
	}
	if _, err := NewRules(Rule{Name: "d", Limiter: waitOnly{lim}, Estimate: estimate}); err == nil || !strings.Contains(err.Error(), `rule "d" has an Estimate`) {
		t.Errorf("a rule with an Estimate on a Limiter that cannot settle: %v", err)
	}
}

// waitOnly is a Limiter that cannot settle.
type waitOnly struct{ Limiter }

// TestBodySettlesWhenDecoded: a client that decodes the JSON of a response
// (json.Decoder) and closes it, as most Go clients do, never reads its
// EOF: over HTTP/2, whose EOF comes in a further read, and over HTTP/1.1
// when the last chunk comes late. The body read is whole nonetheless, and
// Close settles the reservation at the usage: 29 tokens, not the 400
// estimated.
func TestBodySettlesWhenDecoded(t *testing.T) {
	for name, http2 := range map[string]bool{"HTTP/2": true, "HTTP/1.1 chunked": false} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.(http.Flusher).Flush() // no Content-Length: the body streams
				io.WriteString(w, apiSample(t, "openai-chat.json"))
				w.(http.Flusher).Flush()
				time.Sleep(200 * time.Millisecond) // the end of the stream comes late
			}))
			srv.EnableHTTP2 = http2
			srv.StartTLS()
			t.Cleanup(srv.Close)
			lim := mustLocal(t, hourlyTokens)
			client := settlingClient(lim)
			client.Transport.(*Transport).Base = srv.Client().Transport
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.ProtoMajor == 2; got != http2 {
				t.Fatalf("the response came over %s", resp.Proto)
			}
			var v struct{ ID string }
			if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.ID == "" {
				t.Fatalf("decode: %v, %+v", err, v)
			}
			resp.Body.Close()
			if used := tokensUsed(t, lim, "llm"); used != 29 {
				t.Errorf("the key used %d tokens after the body was decoded and closed, want the usage's 29", used)
			}
		})
	}
}

// FuzzJSONEnd: whatever the bytes, and however they are split into reads,
// jsonEnd never panics; a valid object or array, split anywhere, is whole
// once all of it has passed, and a prefix of one that stops before its last
// byte is not.
func FuzzJSONEnd(f *testing.F) {
	f.Add([]byte(apiSample(f, "openai-chat.json")), 10)
	f.Add([]byte(`{"a":"}\"{","b":[1,{"c":"]"}]}`), 3)
	f.Add([]byte(`data: {"x":1}`), 1)
	f.Add([]byte(` [ ] `), 2)
	f.Fuzz(func(t *testing.T, body []byte, split int) {
		var j jsonEnd
		for rest := body; len(rest) > 0; {
			n := min(max(split, 1), len(rest))
			j.scan(rest[:n])
			rest = rest[n:]
		}
		trimmed := bytes.TrimSpace(body)
		if len(trimmed) == 0 || (trimmed[0] != '{' && trimmed[0] != '[') || !json.Valid(trimmed) {
			return
		}
		if !j.whole() {
			t.Fatalf("%q: a valid value, not whole", body)
		}
		var prefix jsonEnd
		prefix.scan(trimmed[:len(trimmed)-1])
		if prefix.whole() {
			t.Fatalf("%q: whole before its last byte", trimmed[:len(trimmed)-1])
		}
	})
}
