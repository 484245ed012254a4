package pace

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// trackedBody is a request body that counts its Close calls.
type trackedBody struct {
	io.Reader
	closes atomic.Int32
}

func (b *trackedBody) Close() error {
	b.closes.Add(1)
	return nil
}

// countingBase is a RoundTripper that counts its calls and answers with
// resp and err.
type countingBase struct {
	calls, closeIdle atomic.Int32
	resp             *http.Response
	err              error
}

func (b *countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.calls.Add(1)
	if req.Body != nil {
		req.Body.Close()
	}
	return b.resp, b.err
}

func (b *countingBase) CloseIdleConnections() { b.closeIdle.Add(1) }

// TestTransportClosesBodyOnEveryErrorPath: whatever stops a request before
// Base, its body is closed, Base is not called, and the error says why.
func TestTransportClosesBodyOnEveryErrorPath(t *testing.T) {
	busy := func() Limiter { // a limiter whose next grant is 10 s away
		loc := mustLocal(t, Every(10*time.Second))
		loc.Wait(context.Background(), "busy:80", 1)
		return loc
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	waiting, cancelWaiting := context.WithCancel(context.Background())
	defer cancelWaiting()
	cases := map[string]struct {
		transport func() *Transport
		ctx       func() (context.Context, context.CancelFunc)
		url       string
		want      error  // errors.Is target, or nil
		wantText  string // in the error
	}{
		"cost above burst": {
			transport: func() *Transport {
				return &Transport{Limiter: mustLocal(t, PerSecond(5)), Cost: func(*http.Request) int { return 6 }}
			},
			wantText: "cost 6 exceeds the burst 5",
		},
		"deadline too close": {
			transport: func() *Transport { return &Transport{Limiter: busy()} },
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Second)
			},
			want: context.DeadlineExceeded,
		},
		"cancelled while waiting": {
			transport: func() *Transport {
				lim := busy().(*Local)
				lim.config.observer = func(_ context.Context, e Event) { // the wait is booked: end it now
					if e.Kind == EventWait {
						cancelWaiting()
					}
				}
				return &Transport{Limiter: lim}
			},
			ctx:  func() (context.Context, context.CancelFunc) { return waiting, cancelWaiting },
			want: context.Canceled,
		},
		"cancelled before": {
			transport: func() *Transport { return &Transport{Limiter: mustLocal(t, PerSecond(5))} },
			ctx:       func() (context.Context, context.CancelFunc) { return cancelled, func() {} },
			want:      context.Canceled,
		},
		"empty key": {
			transport: func() *Transport {
				return &Transport{Limiter: mustLocal(t, PerSecond(5)), Key: func(*http.Request) string { return "" }}
			},
			wantText: "empty key",
		},
		"no URL": {
			transport: func() *Transport { return &Transport{Limiter: mustLocal(t, PerSecond(5))} },
			url:       "none",
			wantText:  "no URL",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			body := &trackedBody{Reader: strings.NewReader("payload")}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://busy/upload", body)
			if err != nil {
				t.Fatal(err)
			}
			if tc.url == "none" {
				req.URL = nil
			}
			base := &countingBase{}
			tr := tc.transport()
			tr.Base = base
			resp, err := tr.RoundTrip(req)
			if resp != nil || err == nil {
				t.Fatalf("RoundTrip = %v, %v; want an error", resp, err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v, want one wrapping %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error %q, want it to say %q", err, tc.wantText)
			}
			if n := body.closes.Load(); n != 1 {
				t.Errorf("body closed %d times, want once", n)
			}
			if n := base.calls.Load(); n != 0 {
				t.Errorf("Base called %d times on an error path", n)
			}
		})
	}
}

// TestTransportCancelsPromptly: a request waiting on a busy Redis bucket
// returns soon after its context is cancelled, not when its turn comes, and
// gives its token back.
func TestTransportCancelsPromptly(t *testing.T) {
	c := newTestRedis(t)
	booked := make(chan time.Duration, 1)
	lim := mustRedis(t, c, Every(10*time.Second), WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventWait && e.Delay > 0 {
			booked <- e.Delay
		}
	}))
	tr := &Transport{Base: &countingBase{}, Limiter: lim}
	req, _ := http.NewRequest(http.MethodGet, "http://upstream/", nil)
	if _, err := tr.RoundTrip(req); err != nil { // takes the only token
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(req.WithContext(ctx))
		done <- err
	}()
	delay := <-booked
	cancelled := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("RoundTrip: %v, want an error wrapping context.Canceled", err)
		}
		t.Logf("a wait of %v returned %v after its cancel", delay, time.Since(cancelled))
	case <-time.After(time.Second):
		t.Fatalf("RoundTrip still waiting a second after its cancel (its turn was %v away)", delay)
	}
	if b, err := storeOf(lim).Reserve(context.Background(), store.Request{Key: "upstream:80", Costs: uniform(1, store.MaxLimits)}, 0, 0); err != nil || b.Delay < 9*time.Second || b.Delay > 10*time.Second {
		t.Errorf("next caller would wait %v (%v), want under 10s: the cancelled token came back", b.Delay, err)
	}
}

// TestTransportLeavesRequestUnchanged: RoundTrip does not modify the
// caller's request, and Base receives that same request.
func TestTransportLeavesRequestUnchanged(t *testing.T) {
	var got *http.Request
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		got = req
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: req}, nil
	})
	tr := &Transport{Base: base, Limiter: mustLocal(t, PerSecond(5)),
		Key:  func(r *http.Request) string { return r.Header.Get("X-Tenant") },
		Cost: func(r *http.Request) int { return 2 }}
	req, err := http.NewRequest(http.MethodPut, "https://API.Example.com:8443/v1/items?id=7#frag", strings.NewReader(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("Authorization", "Bearer secret")
	before := req.Clone(context.Background())
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got != req {
		t.Errorf("Base received %p, want the caller's request %p", got, req)
	}
	if req.Method != before.Method || req.URL.String() != before.URL.String() || req.Host != before.Host ||
		!reflect.DeepEqual(req.Header, before.Header) || req.ContentLength != before.ContentLength {
		t.Errorf("request changed:\n got %s %s %v %v\nwant %s %s %v %v", req.Method, req.URL, req.Header, req.ContentLength,
			before.Method, before.URL, before.Header, before.ContentLength)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestTransportReturnsBaseUntouched: Base's response and error come back as
// they were, also a 429 or 500, also an error.
func TestTransportReturnsBaseUntouched(t *testing.T) {
	baseErr := errors.New("connection refused")
	for _, base := range []*countingBase{
		{resp: &http.Response{StatusCode: http.StatusTooManyRequests, Body: http.NoBody}},
		{resp: &http.Response{StatusCode: http.StatusInternalServerError, Body: http.NoBody}},
		{err: baseErr},
	} {
		tr := &Transport{Base: base, Limiter: mustLocal(t, PerSecond(100))}
		req, _ := http.NewRequest(http.MethodGet, "http://upstream/", nil)
		resp, err := tr.RoundTrip(req)
		if resp != base.resp || err != base.err {
			t.Errorf("RoundTrip = %v, %v; want Base's own %v, %v", resp, err, base.resp, base.err)
		}
		if base.calls.Load() != 1 {
			t.Errorf("Base called %d times, want once", base.calls.Load())
		}
	}
}

// TestTransportZeroValue: the zero Transport sends requests through
// http.DefaultTransport without pacing, and CloseIdleConnections reaches Base.
func TestTransportZeroValue(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	defer srv.Close()
	var tr Transport
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: &tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello" {
		t.Errorf("body %q", body)
	}

	base := &countingBase{}
	(&Transport{Base: base}).CloseIdleConnections()
	if base.closeIdle.Load() != 1 {
		t.Errorf("CloseIdleConnections reached Base %d times, want once", base.closeIdle.Load())
	}
}

// TestTransportPacesByHost: requests draw on their host's bucket, and a
// user's own Limiter sees the key and cost.
func TestTransportPacesByHost(t *testing.T) {
	var seen []string
	lim := limiterFunc(func(ctx context.Context, key string, cost int) error {
		seen = append(seen, key+"/"+strings.Repeat("*", cost))
		return nil
	})
	tr := &Transport{Base: &countingBase{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}, Limiter: lim,
		Cost: func(r *http.Request) int { return len(r.URL.Query()["page"]) + 1 }}
	for _, u := range []string{"https://API.example.com/a", "http://api.example.com:8080/b?page=1", "https://api.example.com:443/c?page=1&page=2"} {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"api.example.com:443/*", "api.example.com:8080/**", "api.example.com:443/***"}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("limiter saw %q, want %q", seen, want)
	}
}

type limiterFunc func(ctx context.Context, key string, cost int) error

func (f limiterFunc) Wait(ctx context.Context, key string, cost int) error { return f(ctx, key, cost) }

func TestHostKey(t *testing.T) {
	for raw, want := range map[string]string{
		"https://API.Example.COM/v1":  "api.example.com:443",
		"http://example.com/":         "example.com:80",
		"http://example.com:8080/x":   "example.com:8080",
		"HTTPS://example.com":         "example.com:443",
		"http://[::1]/":               "[::1]:80",
		"https://[2001:DB8::1]:9443/": "[2001:db8::1]:9443",
		"gopher://example.com":        "example.com",
		"/relative/path":              "",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := HostKey(&http.Request{URL: u}); got != want {
			t.Errorf("HostKey(%s) = %q, want %q", raw, got, want)
		}
	}
}

// counted is a user's decorator of a limiter: it counts the waits it
// forwards.
type counted struct {
	inner Limiter
	waits atomic.Int64
}

func (c *counted) Wait(ctx context.Context, key string, cost int) error {
	c.waits.Add(1)
	return c.inner.Wait(ctx, key, cost)
}

// TestTransportThroughADecorator: a Transport on a user's decorator of a
// Redis limiter (a real redis-server) with a cap in flight waits through
// it for each request, and each wait takes and frees a slot (before the
// protocol was pace's own, every request failed unless the decorator
// forwarded six interfaces: "take a slot with Acquire"); what the
// responses say reaches no limiter (a limiter of a user's is only waited
// on), and an Estimate on it is refused up front.
func TestTransportThroughADecorator(t *testing.T) {
	log := &eventLog{}
	r := mustRedis(t, newTestRedis(t), AllOf(Concurrent(2), PerSecond(100)), WithFleetSize(1), WithObserver(log.observe))
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Ratelimit-Limit-Requests", "100")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "90")
		w.Header().Set("X-Ratelimit-Reset-Requests", "1s")
	}))
	defer api.Close()
	d := &counted{inner: r}
	client := &http.Client{Transport: &Transport{Limiter: d}}
	const sent = 5
	for i := range sent {
		resp, err := client.Get(api.URL)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
	}
	_, read := log.last(EventReading)
	slots, freed := log.count(EventSlot), log.count(EventSlotRelease)
	if d.waits.Load() != sent || slots != sent || freed != sent || read {
		t.Errorf("through the decorator: %d waits, %d slots taken and %d freed of %d requests, a reading heard %v; want a wait, a slot taken and freed each, no reading", d.waits.Load(), slots, freed, sent, read)
	}
	if _, err := NewRules(Rule{Name: "llm", Limiter: d, Estimate: func(*http.Request) Costs { return nil }}); err == nil || !strings.Contains(err.Error(), "Local or Redis") {
		t.Errorf("a Rule with an Estimate on the decorator: %v, want refused up front", err)
	}
}

// loggedLocal and loggedRedis are decorators of a user's the common Go way:
// they embed pace's limiter and override Wait.
type loggedLocal struct {
	*Local
	waits atomic.Int64
}

func (l *loggedLocal) Wait(ctx context.Context, key string, cost int) error {
	l.waits.Add(1)
	return l.Local.Wait(ctx, key, cost)
}

type loggedRedis struct {
	*Redis
	waits atomic.Int64
}

func (l *loggedRedis) Wait(ctx context.Context, key string, cost int) error {
	l.waits.Add(1)
	return l.Redis.Wait(ctx, key, cost)
}

// TestEmbeddingDecoratorIsWaitedOn: a decorator that embeds *Local or
// *Redis has pace's unexported methods too, promoted; a Transport, a Rule
// and a Pool took it for pace's own limiter and never called its Wait (5
// requests, 0 waits). It is a Limiter of the user's: its Wait is called for
// every request, and what needs pace's own limiter (an Estimate, a Pool)
// is refused with an error that says to pass the limiter it embeds.
func TestEmbeddingDecoratorIsWaitedOn(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer api.Close()
	local := &loggedLocal{Local: mustLocal(t, PerSecond(1000))}
	redisOne := &loggedRedis{Redis: mustRedis(t, scriptRedis(t), PerSecond(1000), WithFleetSize(1))}
	for _, d := range []struct {
		name  string
		l     Limiter
		waits func() int64
	}{{"Local", local, local.waits.Load}, {"Redis", redisOne, redisOne.waits.Load}} {
		rules, err := NewRules(Rule{Name: "all", Limiter: d.l})
		if err != nil {
			t.Fatal(err)
		}
		const sent = 5
		for _, tr := range []*Transport{{Limiter: d.l}, {Rules: rules}} {
			before := d.waits()
			client := &http.Client{Transport: tr}
			for i := range sent {
				resp, err := client.Get(api.URL)
				if err != nil {
					t.Fatalf("%s: request %d: %v", d.name, i, err)
				}
				resp.Body.Close()
			}
			if got := d.waits() - before; got != sent {
				t.Errorf("%s decorator (rules %v): its Wait called %d times for %d requests", d.name, tr.Rules != nil, got, sent)
			}
		}
		_, err = NewRules(Rule{Name: "llm", Limiter: d.l, Estimate: func(*http.Request) Costs { return nil }})
		pool := &Pool{Credentials: []Credential{{Name: "a", Secret: "x"}}}
		_, perr := pool.Wait(context.Background(), d.l, "k", 1)
		for _, e := range []error{err, perr} {
			if e == nil || !strings.Contains(e.Error(), "embeds one") || !strings.Contains(e.Error(), "pass the limiter it embeds") {
				t.Errorf("%s decorator with an Estimate or a Pool: %v, want refused, saying to pass the limiter it embeds", d.name, e)
			}
		}
	}
}
