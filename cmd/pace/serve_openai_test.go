package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/redistest"
)

// openaiVersion is the version of the openai npm package the test installs.
const openaiVersion = "7.59.0"

// installOpenAI installs the official openai npm package beside
// testdata/openai_stream.mjs in a directory of the test's, and returns the
// script's path there.
func installOpenAI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script, err := os.ReadFile("testdata/openai_stream.mjs")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private": true, "type": "module"}`), 0o600)
	os.WriteFile(filepath.Join(dir, "openai_stream.mjs"), script, 0o600)
	npm := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "openai@"+openaiVersion)
	npm.Dir = dir
	if out, err := npm.CombinedOutput(); err != nil {
		t.Fatalf("npm install openai@%s: %v\n%s", openaiVersion, err, out)
	}
	return filepath.Join(dir, "openai_stream.mjs")
}

// A streamedChunk is a line of openai_stream.mjs.
type streamedChunk struct {
	Index   int
	MS      float64
	Content *string
	Usage   *struct {
		TotalTokens int `json:"total_tokens"`
	}
}

// sse is an upstream that speaks OpenAI's chat completions stream, and
// writes each chunk only once the one before it is read (next).
type sse struct {
	next chan struct{}
}

// sseChunks are what sse sends, before "data: [DONE]".
var sseChunks = []string{
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}],"usage":null}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{"content":" there."},"finish_reason":null}],"usage":null}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":18,"total_tokens":30}}`,
}

func (s *sse) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-RateLimit-Remaining-Tokens", "149000")
	for _, chunk := range sseChunks {
		fmt.Fprintf(w, "data: %s\n\n", chunk)
		w.(http.Flusher).Flush()
		select {
		case <-s.next:
		case <-r.Context().Done():
			return
		}
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// TestServeStreamsOpenAI streams a chat completion with the official
// openai npm package through pace serve: each chunk arrives before the
// upstream writes the next, and the usage settles the reservation.
func TestServeStreamsOpenAI(t *testing.T) {
	script := installOpenAI(t)
	upstream := &sse{next: make(chan struct{})}
	server := httptest.NewServer(upstream)
	defer server.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: llm, path: /openai/, upstream: '%s/v1', limits: {tokens: 6000/m}, costs: openai}\n", redisServer.Addr, server.URL))
	for _, run := range []struct{ name, url string }{{"direct", server.URL + "/v1"}, {"pace serve", base + "/openai"}} {
		chunks := streamOpenAI(t, script, run.url, upstream)
		if len(chunks) != len(sseChunks) || chunks[len(chunks)-1].Usage == nil || chunks[len(chunks)-1].Usage.TotalTokens != 30 {
			t.Fatalf("%s: %d chunks, the last %+v; want %d, the last with 30 tokens of usage", run.name, len(chunks), chunks[len(chunks)-1], len(sseChunks))
		}
		t.Logf("%s: the first chunk after %.2f ms", run.name, chunks[0].MS)
	}
	limiter, err := pace.NewRedis(redisServer.Client(t), pace.PerMinute(6000).Named("tokens"))
	if err != nil {
		t.Fatal(err)
	}
	defer limiter.Close()
	key := "llm|" + strings.TrimPrefix(server.URL, "http://")
	// Estimated at its max_tokens of 1,000 and more, settled at 30: 5,960
	// tokens are left to take at once only once it is settled.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		err := limiter.Wait(ctx, key, 5960)
		cancel()
		var late *pace.DeadlineError
		if err == nil {
			break
		}
		if !errors.As(err, &late) || time.Now().After(deadline) {
			t.Fatalf("the stream's usage of 30 tokens is not settled after 5 s: %v", err)
		}
	}
}

// streamOpenAI runs the openai script against url, letting upstream write
// each chunk once the script has printed the one before, and returns the
// chunks it printed.
func streamOpenAI(t *testing.T, script, url string, upstream *sse) []streamedChunk {
	t.Helper()
	node := exec.Command("node", script, url)
	node.Dir = filepath.Dir(script)
	node.Stderr = os.Stderr
	stdout, _ := node.StdoutPipe()
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	var chunks []streamedChunk
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		var c streamedChunk
		if err := json.Unmarshal(lines.Bytes(), &c); err != nil {
			t.Fatalf("node printed %q: %v", lines.Text(), err)
		}
		chunks = append(chunks, c)
		select { // a stream held back would never print the chunk the upstream waits on
		case upstream.next <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatalf("the upstream did not ask for the chunk after %d", c.Index)
		}
	}
	if err := node.Wait(); err != nil {
		t.Fatalf("node %s %s: %v", script, url, err)
	}
	return chunks
}
