package pace

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
)

// refusingUpstream answers its requests in turn with what answer says of
// the nth (1, 2, ...): a status and a JSON body, no header; it counts what
// it was asked. While together is above 1, the first together requests
// wait until all have come, so that they are answered at once.
func refusingUpstream(t *testing.T, answer func(n int32) (int, string), together int) (*httptest.Server, *atomic.Int32) {
	var asked atomic.Int32
	var arrived sync.WaitGroup
	arrived.Add(together)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := asked.Add(1)
		if together > 1 && int(n) <= together {
			arrived.Done()
			arrived.Wait()
		}
		status, body := answer(n)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &asked
}

// geminiBody is a Gemini refusal whose RetryInfo asks for delay.
func geminiBody(delay string) string {
	return `{"error": {"code": 429, "message": "You exceeded your current quota.", "status": "RESOURCE_EXHAUSTED", "details": [` +
		`{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}]},` +
		`{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "` + delay + `"}]}}`
}

// TestRetryInfoHoldsTheFleet: Gemini 429s whose bodies say retryDelay
// hold the key for the fleet, and weigh in its rate as any refusal does:
// four in a row (0.3 s each: the first opens the key's rate, the others
// cut it), then one of "3s", after which another process's next request
// waits 2.5 s or more. The callers read the whole bodies, as they came.
func TestRetryInfoHoldsTheFleet(t *testing.T) {
	srv := redistest.Start(t)
	const short = 4
	answer := func(n int32) (int, string) {
		switch {
		case n <= short:
			return http.StatusTooManyRequests, geminiBody("0.3s")
		case n == short+1:
			return http.StatusTooManyRequests, geminiBody("3s")
		}
		return http.StatusOK, "{}"
	}
	upstream, asked := refusingUpstream(t, answer, 1)
	var logs [2]eventLog
	var clients [2]*http.Client
	for i := range clients {
		r := mustRedis(t, srv.Client(t), PerSecond(10), WithObserver(logs[i].observe), WithFleetSize(2))
		clients[i] = &http.Client{Transport: &Transport{Limiter: r, Key: func(*http.Request) string { return "gemini" }}}
	}
	for n := range int32(short + 1) {
		resp, err := clients[0].Get(upstream.URL)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if _, want := answer(n + 1); err != nil || string(body) != want || resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("refusal %d reached the caller as %d %q, %v", n+1, resp.StatusCode, body, err)
		}
	}
	start := time.Now()
	resp, err := clients[1].Get(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if waited := time.Since(start); waited < 2500*time.Millisecond {
		t.Errorf("the other process's next request went after %v, want 2.5 s or more", waited)
	}
	if n := logs[0].count(EventRate); n == 0 {
		t.Error("the refusing process heard no cut of the key's rate: a refusal that says when to retry still says the fleet went too fast")
	}
	if e, ok := logs[0].last(EventHold); !ok || !strings.Contains(e.Reason, `RetryInfo retryDelay: 3s`) {
		t.Errorf("the hold's event: %+v, %v; want one that says the body's RetryInfo", e, ok)
	}
	if n := asked.Load(); n != short+2 {
		t.Errorf("the upstream was asked %d times, want %d", n, short+2)
	}
}

// githubSecondaryBody is GitHub's refusal of a secondary limit, with no
// header that says when.
const githubSecondaryBody = `{"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", ` +
	`"documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits", "status": "403"}`

// TestSecondaryLimitHolds: GitHub's secondary 403 with no header holds the
// key a minute: the next request, whose deadline is a second away, is
// refused with a DeadlineError that says so; two or eight such 403s to
// requests in flight together are one event, which holds it a minute too
// (before, each doubled it: two minutes, an hour). The retry client
// retries such a 403, whose next attempt waits out the hold (refused here
// by its deadline, not sent).
func TestSecondaryLimitHolds(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		together int
		want     time.Duration
	}{{1, time.Minute}, {2, time.Minute}, {8, time.Minute}} {
		answer := func(n int32) (int, string) {
			if int(n) <= tc.together {
				return http.StatusForbidden, githubSecondaryBody
			}
			return http.StatusOK, "{}"
		}
		upstream, asked := refusingUpstream(t, answer, tc.together)
		r := mustRedis(t, srv.Client(t), PerSecond(10), WithPrefix(upstream.URL), WithFleetSize(1))
		tr := &Transport{Limiter: r}
		var wg sync.WaitGroup
		for range tc.together {
			wg.Go(func() {
				resp, err := (&http.Client{Transport: tr}).Get(upstream.URL)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			})
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
		_, err := NewRetryClient(tr).StandardClient().Do(req)
		cancel()
		var refused *DeadlineError
		if !errors.As(err, &refused) || refused.Delay < tc.want-time.Second || refused.Delay > tc.want {
			t.Errorf("%d secondary 403s: the next request: %v, want a DeadlineError of a wait of %v", tc.together, err, tc.want)
		}
		if n := asked.Load(); n != int32(tc.together) {
			t.Errorf("%d secondary 403s: the upstream was asked %d times, want %d", tc.together, n, tc.together)
		}
	}
}

// TestCompressedRefusalHolds: a caller that asks for compressed answers
// itself (Accept-Encoding: gzip or deflate, which Go's transport then
// leaves encoded) gets Gemini's RetryInfo refusal compressed: it holds the
// key as the plain one does (the next request waits past a 1 s budget),
// and the caller reads the bytes the upstream wrote.
func TestCompressedRefusalHolds(t *testing.T) {
	body := geminiBody("30s")
	for _, enc := range []string{"gzip", "deflate"} {
		var asked atomic.Int32
		var sent []byte
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			asked.Add(1)
			var b bytes.Buffer
			zw := map[string]io.WriteCloser{"gzip": gzip.NewWriter(&b), "deflate": zlib.NewWriter(&b)}[enc]
			io.WriteString(zw, body)
			zw.Close()
			sent = b.Bytes()
			w.Header().Set("Content-Encoding", enc)
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write(sent)
		}))
		defer upstream.Close()
		client := &http.Client{Transport: &Transport{Limiter: mustLocal(t, mustParseLimit(t, "100/s"))}}
		req, _ := http.NewRequest(http.MethodGet, upstream.URL, nil)
		req.Header.Set("Accept-Encoding", enc)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Equal(got, sent) {
			t.Errorf("%s: the caller read %d bytes, want the %d the upstream wrote", enc, len(got), len(sent))
		}
		req, _ = http.NewRequestWithContext(WithWaitBudget(context.Background(), time.Second), http.MethodGet, upstream.URL, nil)
		if _, err := client.Do(req); !errors.As(err, new(*DeadlineError)) || asked.Load() != 1 {
			t.Errorf("%s: the request after a compressed RetryInfo of 30 s: %v, the upstream asked %d times; want a *DeadlineError, asked once", enc, err, asked.Load())
		}
	}
}

// FuzzDecoded: whatever a body's start and its content encoding, decoded
// never panics and returns at most headers.BodySize bytes.
func FuzzDecoded(f *testing.F) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	io.WriteString(zw, geminiBody("3s"))
	zw.Close()
	f.Add(b.Bytes(), "gzip")
	f.Add(b.Bytes()[:20], "gzip")
	f.Add([]byte("x\x9c\x01\x00\x00\xff\xff"), "deflate")
	f.Add([]byte(`{"error": {}}`), "br")
	f.Fuzz(func(t *testing.T, start []byte, encoding string) {
		if out := decoded(start, encoding); len(out) > headers.BodySize {
			t.Errorf("decoded %d bytes, more than %d", len(out), headers.BodySize)
		}
	})
}

// TestSlowRefusalBodyHoldsLate: an upstream sends a 429's status at once
// and its RetryInfo body (30 s) half a second later. The caller gets the
// response within bodyWait and some, not after the body; the body's hold
// is heard once the body came: the next request waits past a 1 s budget.
// A body that never comes keeps nothing: closed, its read ends.
func TestSlowRefusalBodyHoldsLate(t *testing.T) {
	release := make(chan struct{})
	var asked atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		w.(http.Flusher).Flush()
		if r.URL.Path == "/never" {
			<-release
			return
		}
		time.Sleep(500 * time.Millisecond)
		io.WriteString(w, geminiBody("30s"))
	}))
	defer upstream.Close()
	defer close(release)
	client := &http.Client{Transport: &Transport{Limiter: mustLocal(t, mustParseLimit(t, "100/s"))}}
	start := time.Now()
	resp, err := client.Get(upstream.URL + "/never")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > bodyWait+400*time.Millisecond {
		t.Errorf("a 429 whose body never comes: the status took %v, want about %v", took, bodyWait)
	}
	resp.Body.Close()
	start = time.Now()
	resp, err = client.Get(upstream.URL + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > bodyWait+400*time.Millisecond {
		t.Errorf("a 429 whose body comes 0.5 s after its status: the status took %v, want about %v", took, bodyWait)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != geminiBody("30s") {
		t.Errorf("the caller read %q, want the body as written", body)
	}
	var late *DeadlineError
	for deadline := time.Now().Add(2 * time.Second); ; {
		req, _ := http.NewRequestWithContext(WithWaitBudget(context.Background(), time.Second), http.MethodGet, upstream.URL+"/slow", nil)
		_, err = client.Do(req)
		if errors.As(err, &late) || time.Now().After(deadline) {
			break
		}
	}
	if !errors.As(err, &late) || late.Delay < 25*time.Second {
		t.Errorf("after the slow body's RetryInfo of 30 s: %v, want a *DeadlineError of about 30 s", err)
	}
}
