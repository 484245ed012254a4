package pace

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// testBudget is a budget of left bytes (WithBodyBudget).
type testBudget struct {
	mu   sync.Mutex
	left int64
}

func (b *testBudget) Take(n int64) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left < n {
		return nil
	}
	b.left -= n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.left += n
			b.mu.Unlock()
		})
	}
}

func (b *testBudget) remaining() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.left
}

// TestBodyBudget: what a Transport keeps of response bodies counts
// against the budget of the request's context. With room, a body's ends
// settle its reservation (21 tokens of 400) and a refusal's RetryInfo
// holds its key; then every byte is back. Without room, nothing is kept:
// the reservation keeps its estimate, and the refusal holds nothing (its
// status is heeded still), and the caller reads each body whole.
func TestBodyBudget(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/refused" {
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, geminiBody("30s"))
			return
		}
		io.WriteString(w, `{"usage": {"total_tokens": 21}}`)
	}))
	defer upstream.Close()
	for _, room := range []int64{3 * BodyEndSize, 0} {
		budget := &testBudget{left: room}
		ctx := WithBodyBudget(context.Background(), budget.Take)
		lim := mustLocal(t, hourlyTokens)
		settling := settlingClient(lim)
		plain := &http.Client{Transport: &Transport{Limiter: mustLocal(t, mustParseLimit(t, "100/s"))}}
		get := func(client *http.Client, path string) string {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(body)
		}
		get(settling, "/")
		wantUsed := map[bool]int{true: 21, false: 400}[room > 0]
		if used := tokensUsed(t, lim, "llm"); used != wantUsed || budget.remaining() != room {
			t.Errorf("budget %d: %d tokens used, %d bytes left; want %d, and %d", room, used, budget.remaining(), wantUsed, room)
		}
		if body := get(plain, "/refused"); body != geminiBody("30s") {
			t.Errorf("budget %d: the refusal's body read as %q", room, body)
		}
		req, _ := http.NewRequestWithContext(WithBodyBudget(WithWaitBudget(context.Background(), time.Second), budget.Take), http.MethodGet, upstream.URL+"/", nil)
		resp, err := plain.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if held := err != nil; held != (room > 0) || budget.remaining() != room {
			t.Errorf("budget %d: after a RetryInfo of 30 s the next request: %v, %d bytes left; want it held %v, and %d", room, err, budget.remaining(), room > 0, room)
		}
	}
}
