package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/redistest"
)

// startServe starts pace serve in this process with the YAML config,
// listening on a free loopback port, and returns its URL.
func startServe(t testing.TB, config string) (*server, string) {
	t.Helper()
	c, err := parseConfig([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	c.Listen = "127.0.0.1:0"
	for i := range c.Routes {
		c.Routes[i].Listen = c.Listen
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	s, err := newServer(context.Background(), c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.start(); err != nil {
		s.close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.shutdown() })
	return s, "http://" + s.listeners[0].Addr().String()
}

func TestServeConfigErrors(t *testing.T) {
	t.Setenv("PACE_TEST_EMPTY", "")
	t.Setenv("PACE_TEST_KEY", "sk-test")
	t.Setenv("PACE_TEST_KEY2", "sk-test-2")
	t.Setenv("PACE:KEY", "sk-test-3")
	t.Setenv("PACE_TEST_KEY_COPY", "sk-test")
	t.Setenv("PACE_TEST_KEY_LINE", "sk-test-4\n")
	route := func(extra string) string {
		return "routes:\n  - name: api\n    upstream: http://127.0.0.1:1/v1\n" + extra
	}
	cases := map[string]struct{ config, want string }{
		"unknown field":          {route("    limit: 1/s\n    limt: 2/s\n"), "field limt not found"},
		"no routes":              {"listen: 127.0.0.1:1\n", "routes: want at least one route"},
		"no limit":               {route(""), `limit "", limits map[]: want one of them`},
		"both limits":            {route("    limit: 1/s\n    limits: {tokens: 10/s}\n"), "want one of them"},
		"bad limit":              {route("    limit: 10/x\n"), `limit: pace: invalid limit "10/x"`},
		"bad named limit":        {route("    limits: {tokens: lots}\n"), `limits.tokens: pace: invalid limit "lots"`},
		"same name":              {route("    limit: 1/s\n    path: /a/\n  - name: api\n    upstream: http://x\n    limit: 1/s\n    path: /b/\n"), `name "api": another route has it`},
		"shadowed route":         {route("    limit: 1/s\n  - name: other\n    upstream: http://x\n    limit: 1/s\n"), `path "/": route "api" takes every request there first, so this route can match none`},
		"path without slash":     {route("    limit: 1/s\n    path: /openai\n"), `path "/openai": want a prefix that ends in a slash (/openai/)`},
		"path on pace's own":     {route("    limit: 1/s\n    path: /pace/v1/\n"), `path "/pace/v1/"`},
		"upstream scheme":        {"routes:\n  - name: a\n    upstream: ftp://x\n    limit: 1/s\n", `upstream "ftp://x": want an http or https URL`},
		"upstream no host":       {"routes:\n  - name: a\n    upstream: http:///v1\n    limit: 1/s\n", `upstream "http:///v1": want a host`},
		"bad name":               {"routes:\n  - name: a b\n    upstream: http://x\n    limit: 1/s\n", `name "a b"`},
		"costs of no limit":      {route("    limit: 1/s\n    costs: openai\n"), `costs "openai": want limits named [tokens]`},
		"unknown costs":          {route("    limits: {tokens: 1/s}\n    costs: gemini\n"), `costs "gemini": want anthropic, openai or nothing`},
		"bad class header":       {route("    limit: 1/s\n    class_header: 'X Class'\n"), `class_header "X Class": not a header name`},
		"unset api key":          {route("    limit: 1/s\n    api_key_env: PACE_TEST_EMPTY\n"), `api_key_env "PACE_TEST_EMPTY": that variable is empty or unset`},
		"pool beside a key":      {route("    limit: 1/s\n    api_key_env: PACE_TEST_KEY\n    api_keys_env: [PACE_TEST_KEY2]\n"), `api_keys_env with api_key_env "PACE_TEST_KEY"`},
		"empty pool":             {route("    limit: 1/s\n    api_keys_env: []\n"), "api_keys_env: want one variable at least"},
		"pool key unset":         {route("    limit: 1/s\n    api_keys_env: [PACE_TEST_KEY, PACE_TEST_EMPTY]\n"), `api_keys_env "PACE_TEST_EMPTY": that variable is empty or unset`},
		"pool key twice":         {route("    limit: 1/s\n    api_keys_env: [PACE_TEST_KEY, PACE_TEST_KEY2, PACE_TEST_KEY]\n"), `api_keys_env: pace: Pool.Credentials[2]: name "PACE_TEST_KEY" is taken`},
		"pool secret twice":      {route("    limit: 1/s\n    api_keys_env: [PACE_TEST_KEY, PACE_TEST_KEY_COPY]\n"), `api_keys_env: pace: Pool.Credentials[1] "PACE_TEST_KEY_COPY": its secret is "PACE_TEST_KEY"'s too`},
		"pool secret newline":    {route("    limit: 1/s\n    api_keys_env: [PACE_TEST_KEY_LINE]\n"), `api_keys_env: pace: Pool.Credentials[0] "PACE_TEST_KEY_LINE": its secret cannot be a header value`},
		"pool key name":          {route("    limit: 1/s\n    api_keys_env: ['PACE:KEY']\n"), `api_keys_env: pace: Pool.Credentials[0]: name "PACE:KEY"`},
		"pool under a cap":       {route("    limit: 1/s\n    in_flight: 2\n    api_keys_env: [PACE_TEST_KEY]\n"), "api_keys_env with in_flight 2"},
		"affinity without pool":  {route("    limit: 1/s\n    affinity_header: X-Session\n"), `affinity_header "X-Session": without api_keys_env`},
		"bad affinity header":    {route("    limit: 1/s\n    api_keys_env: [PACE_TEST_KEY]\n    affinity_header: 'X Session'\n"), `affinity_header "X Session": not a header name`},
		"negative cap":           {route("    limit: 1/s\n    in_flight: -1\n"), "in_flight -1"},
		"short lease":            {route("    limit: 1/s\n    lease: 1ms\n"), "lease 1ms: want 30ms to 1h"},
		"bad listen":             {"listen: nope\n" + route("    limit: 1/s\n"), `listen "nope": want HOST:PORT`},
		"rule takes all":         {route("    limit: 1/s\n    rules:\n      - {name: all, limit: 1/s}\n"), `rules[0] "all": no path and no method: it takes every request`},
		"rule outside path":      {route("    limit: 1/s\n    rules:\n      - {name: s, path: /search/, limit: 1/s}\n"), `rules[0] "s": path "/search/": outside the upstream's path "/v1"`},
		"rule bad method":        {route("    limit: 1/s\n    rules:\n      - {name: s, method: 'G T', limit: 1/s}\n"), `"G T"`},
		"rule bad limit":         {route("    limit: 1/s\n    rules:\n      - {name: s, path: /v1/x/, limit: 0/s}\n"), `rules[0] "s": limit: pace`},
		"rule cost past burst":   {route("    limit: 1/s\n    rules:\n      - {name: s, path: /v1/x/, limit: 2/s, cost: 5}\n"), "5"},
		"rule body counters":     {route("    limit: 1/s\n    rules:\n      - {name: s, path: /v1/x/, limit: 2/s, body_counters: stripe}\n"), `rules[0] "s": body_counters "stripe": want shopify`},
		"rule calendar zone":     {route("    limit: 1/s\n    rules:\n      - {name: s, path: /v1/x/, limit: 10000/day in Pacific/Atlantis}\n"), `zone "Pacific/Atlantis"`},
		"short idle timeout":     {"idle_timeout: 1ms\n" + route("    limit: 1/s\n"), "idle_timeout 1ms: want 10ms or more"},
		"no connections":         {"max_connections: -1\n" + route("    limit: 1/s\n"), "max_connections -1: want 1 or more"},
		"two documents":          {route("    limit: 1/s\n---\n" + route("    limit: 2/s\n")), "a second YAML document"},
		"path with a space":      {route("    limit: 1/s\n    path: '/a b/'\n"), `path "/a b/"`},
		"path with a pattern":    {route("    limit: 1/s\n    path: '/{x}/'\n"), `path "/{x}/"`},
		"path with dots":         {route("    limit: 1/s\n    path: /a/../b/\n"), `path "/a/../b/"`},
		"path doubled slash":     {route("    limit: 1/s\n    path: /a//b/\n"), `path "/a//b/"`},
		"path with an escape":    {route("    limit: 1/s\n    path: /a%2f/\n"), `path "/a%2f/"`},
		"pace's key header":      {route("    limit: 1/s\n    key_header: X-Pace-Tenant\n"), `key_header "X-Pace-Tenant": pace serve's own headers`},
		"rule's pace key header": {route("    limit: 1/s\n    rules:\n      - {name: s, path: /v1/x/, limit: 2/s, key_header: x-pace-user}\n"), `rules[0] key_header "x-pace-user"`},
		"rule named as a route": {route("    limit: 1/s\n    rules:\n      - {name: api, path: /v1/x/, limit: 2/s}\n"),
			`route "api": rules[0] name "api": route "api" has it`},
		"rule named as another's": {route("    limit: 1/s\n    path: /a/\n    rules:\n      - {name: s, path: /v1/x/, limit: 2/s}\n  - name: b\n    upstream: http://x/v1\n    limit: 1/s\n    path: /b/\n    rules:\n      - {name: s, path: /v1/y/, limit: 2/s}\n"),
			`route "b": rules[0] name "s": route "api"'s rules[0] has it`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := configError(tc.config)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestServeConfigSize: a config file past the limit is refused with no more
// of it read than the limit and a byte.
func TestServeConfigSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, bytes.Repeat([]byte("# padding\n"), 2*maxConfigSize/10), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readConfig(path); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d bytes", maxConfigSize)) {
		t.Errorf("a config of %d bytes: %v, want an error that says the limit", 2*maxConfigSize, err)
	}
}

// configError returns the error of config, checked and built.
func configError(config string) error {
	c, err := parseConfig([]byte(config))
	if err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	return buildError(c)
}

// buildError returns the error of building a server of c.
func buildError(c *serveConfig) error {
	s, err := newServer(context.Background(), c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	s.close()
	return nil
}

func TestServeFlagErrors(t *testing.T) {
	cases := map[string]string{
		"-config x.yaml -limit 1/s":                               "no other flag goes with it",
		"-name a -upstream http://x -limit 1/y":                   `-limit: pace: invalid limit "1/y"`,
		"-limit 1/s":                                              "-upstream: want the upstream's URL, such as -upstream https://api.example.com",
		"-upstream 127.0.0.1:9 -limit 1/s":                        `-upstream "127.0.0.1:9": want an http or https URL with its host, such as -upstream http://127.0.0.1:9`,
		"-upstream api.example.com -limit 1/s":                    `-upstream "api.example.com": want an http or https URL with its host, such as -upstream http://api.example.com`,
		"-upstream http://x":                                      `-limit: want the upstream's limit, such as -limit 100/s`,
		"-upstream http://x -limit 1/s -redis 127.0.0.1:6390":     `-redis "127.0.0.1:6390": want a Redis URL, such as -redis redis://127.0.0.1:6390/0`,
		"-upstream http://x -limit 100/minute -redis redis://x:1": "",
		"-upstream http://x -limit 1/s extra":                     "takes no arguments",
	}
	for args, want := range cases {
		_, _, err := serveFlags(strings.Fields(args), io.Discard)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("pace serve %s: got %v, want an error with %q", args, err, want)
		}
	}
}

// TestServeIsTransparent sends through pace serve what an upstream must
// see unchanged: a request body as it comes, the client's credentials,
// the path beneath the route's prefix; and returns what it answers: its
// status, its headers, its body, a stream each event as it is written.
func TestServeIsTransparent(t *testing.T) {
	redisServer := redistest.Start(t)
	bodyPart := make(chan string)
	sent := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen := fmt.Sprintf("%s %s auth=%q hop=%q pace=%q", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), r.Header.Get("X-Hop"), r.Header.Get("X-Pace-Max-Wait"))
		w.Header().Set("X-Seen", seen)
		w.Header().Set("X-RateLimit-Remaining", "4999")
		if r.URL.Path == "/v1/upload" { // the first part of the body comes before the client sends the second
			part := make([]byte, 5)
			io.ReadFull(r.Body, part)
			bodyPart <- string(part)
			rest, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "%s+%s", part, rest)
			return
		}
		if r.URL.Path == "/v1/duplex" { // answers the first part before the client sends the second
			http.NewResponseController(w).EnableFullDuplex()
			part := make([]byte, 5)
			io.ReadFull(r.Body, part)
			fmt.Fprintf(w, "%s\n", part)
			w.(http.Flusher).Flush()
			rest, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s\n", rest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: chunk %d\n\n", i)
			w.(http.Flusher).Flush()
			<-sent // the client has read it
		}
	}))
	defer upstream.Close()
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, path: /api/, upstream: '%s/v1', limit: 100/s}\n", redisServer.Addr, upstream.URL))

	t.Run("stream", func(t *testing.T) {
		req, _ := http.NewRequest("GET", base+"/api/events?x=1", nil)
		req.Header.Set("Authorization", "Bearer client-token")
		req.Header.Set("Connection", "X-Hop")
		req.Header.Set("X-Hop", "dropped")
		req.Header.Set("X-Pace-Max-Wait", "5s")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if want := `GET /v1/events?x=1 auth="Bearer client-token" hop="" pace=""`; resp.Header.Get("X-Seen") != want {
			t.Errorf("the upstream saw %q, want %q", resp.Header.Get("X-Seen"), want)
		}
		if resp.Header.Get("X-RateLimit-Remaining") != "4999" {
			t.Errorf("X-RateLimit-Remaining %q, want the upstream's 4999", resp.Header.Get("X-RateLimit-Remaining"))
		}
		lines := bufio.NewReader(resp.Body)
		for i := range 3 {
			line, err := lines.ReadString('\n')
			if want := fmt.Sprintf("data: chunk %d\n", i); line != want || err != nil {
				t.Fatalf("read %q, %v; want %q", line, err, want)
			}
			lines.ReadString('\n')
			sent <- struct{}{} // the upstream writes the next only now: a buffered stream would never get here
		}
	})
	t.Run("body", func(t *testing.T) {
		reader, writer := io.Pipe()
		go func() {
			writer.Write([]byte("first"))
			<-bodyPart // the upstream has read the first part
			writer.Write([]byte("second"))
			writer.Close()
		}()
		resp, err := http.Post(base+"/api/upload", "text/plain", reader)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated || string(body) != "first+second" {
			t.Errorf("got %d %q, want the upstream's 201 \"first+second\"", resp.StatusCode, body)
		}
	})
	// The answer starts while the body still comes (and, as it did for a
	// stream 1 run in 4, while the transport still reads the body's end):
	// starting it must not close or drain the body the upstream reads.
	t.Run("answered while the body comes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		reader, writer := io.Pipe()
		answered := make(chan struct{})
		go func() {
			writer.Write([]byte("first"))
			select {
			case <-answered:
				writer.Write([]byte("second"))
				writer.Close()
			case <-ctx.Done(): // the client gives up only once its body ends
				writer.CloseWithError(ctx.Err())
			}
		}()
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/api/duplex", reader)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			close(answered)
			t.Fatalf("no answer before the body's end: %v", err)
		}
		defer resp.Body.Close()
		lines := bufio.NewReader(resp.Body)
		first, err := lines.ReadString('\n')
		close(answered)
		second, err2 := lines.ReadString('\n')
		if first != "first\n" || second != "second\n" || err != nil || err2 != nil {
			t.Errorf("read %q (%v) then %q (%v), want the upstream's \"first\" as it answered, then \"second\"", first, err, second, err2)
		}
	})
}

func TestServeReplacesTheClientsKey(t *testing.T) {
	t.Setenv("PACE_TEST_KEY", "route-secret")
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "auth=%q api-key=%q", r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"))
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: a, path: /openai/, upstream: '%s', limit: 100/s, api_key_env: PACE_TEST_KEY}\n  - {name: b, path: /anthropic/, upstream: '%s', limit: 100/s, api_key_env: PACE_TEST_KEY, api_key_header: x-api-key}\n", redisServer.Addr, upstream.URL, upstream.URL))
	for path, want := range map[string]string{
		"/openai/x":    `auth="Bearer route-secret" api-key=""`,
		"/anthropic/x": `auth="" api-key="route-secret"`,
	} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer client-token")
		req.Header.Set("X-Api-Key", "client-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != want {
			t.Errorf("%s: the upstream saw %s, want %s", path, body, want)
		}
	}
}

// TestServeRefusesAWaitPastItsDeadline asks for waits past the client's
// deadline and the route's max_wait: each is a 429 at once whose
// Retry-After is the wait, and books nothing, so a later request's wait is
// the same.
func TestServeRefusesAWaitPastItsDeadline(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, upstream: '%s', limit: 1/m, max_wait: 30s}\n", redisServer.Addr, upstream.URL))
	get := func(header string) *http.Response {
		req, _ := http.NewRequest("GET", base+"/", nil)
		if header != "" {
			req.Header.Set(maxWaitHeader, header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get("0"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the first request, with %s 0: %d, want 200 (free now)", maxWaitHeader, resp.StatusCode)
	}
	for _, header := range []string{"100ms", "0.5", "", "0", "100ms"} { // "": the route's max_wait of 30s
		resp := get(header)
		retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || retry < 59 || retry > 60 {
			t.Errorf("%s %q: %d with Retry-After %q, want 429 with the wait of about 60 s, nothing booked", maxWaitHeader, header, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if resp := get("soon"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("%s soon: %d, want 400", maxWaitHeader, resp.StatusCode)
	}
}

// TestServeWaitEndpoint waits through the wait endpoint and through a Go
// limiter on the same Redis and key: they share the bucket.
func TestServeWaitEndpoint(t *testing.T) {
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, upstream: 'http://127.0.0.1:1', limit: 1/m burst 2}\n", redisServer.Addr))
	post := func(body string) (int, map[string]any) { return postWait(t, base, body) }
	if status, reply := post(`{"cost": 1}`); status != http.StatusOK || reply["key"] != "api|127.0.0.1:1" {
		t.Fatalf("got %d %v, want 200 on the route's key", status, reply)
	}
	limiter, err := pace.NewRedis(redisServer.Client(t), pace.PerMinute(1).WithBurst(2))
	if err != nil {
		t.Fatal(err)
	}
	defer limiter.Close()
	if err := limiter.Wait(context.Background(), "api|127.0.0.1:1", 1); err != nil {
		t.Fatal(err)
	}
	if status, reply := post(`{"timeout_ms": 100}`); status != http.StatusTooManyRequests || reply["retry_after_ms"].(float64) < 59000 {
		t.Errorf("after the Go limiter took the last token: %d %v, want 429 with a wait of about 60 s", status, reply)
	}
	for body, want := range map[string]string{
		`{"cost": 1`:             "wait request",
		`{"cost": 1, "kost": 2}`: `unknown field "kost"`,
		`{"route": "other"}`:     `route "other": no such route`,
		`{"timeout_ms": -1}`:     "timeout_ms -1",
		`{"cost": 5}`:            "exceeds the burst 2",
	} {
		if status, reply := post(body); status/100 != 4 || !strings.Contains(fmt.Sprint(reply["error"]), want) {
			t.Errorf("%s: %d %v, want a 4xx that says %q", body, status, reply, want)
		}
	}
}

// TestServeWaitKeepsKeysInTheirRoute: the wait endpoint books a key under
// the route it names only when the key is the route's or one of its
// rules': another route's key (its bucket at 100/s, booked at 1/h, would
// refuse its requests for an hour on every replica) is a 400 that names
// the field, and the other route serves on.
func TestServeWaitKeepsKeysInTheirRoute(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	host := strings.TrimPrefix(upstream.URL, "http://")
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: fast, path: /fast/, upstream: '%s', limit: 100/s}\n  - name: slow\n    path: /slow/\n    upstream: '%s'\n    limit: 1/h\n    rules:\n      - {name: search, path: /search, limit: 2/h burst 2}\n",
		redisServer.Addr, upstream.URL, upstream.URL))
	post := func(body string) (int, string) {
		status, reply := postWait(t, base, body)
		return status, fmt.Sprint(reply["error"])
	}
	for _, key := range []string{"fast|" + host, "fast", "other|" + host, "slowx|" + host} {
		body := fmt.Sprintf(`{"route": "slow", "key": %q, "timeout_ms": 100}`, key)
		if status, msg := post(body); status != http.StatusBadRequest || !strings.Contains(msg, "key ") {
			t.Errorf("%s: %d %q, want a 400 that names the key", body, status, msg)
		}
	}
	for _, key := range []string{"slow|" + host, "slow|" + host + "|tenant", "search|" + host} {
		body := fmt.Sprintf(`{"route": "slow", "key": %q, "timeout_ms": 100}`, key)
		if status, msg := post(body); status != http.StatusOK {
			t.Errorf("%s: %d %q, want 200", body, status, msg)
		}
	}
	if status, _ := post(fmt.Sprintf(`{"route": "slow", "key": "search|%s", "timeout_ms": 100}`, host)); status != http.StatusOK {
		t.Errorf("the rule's second token: %d, want 200 (the rule's 2/h burst 2, not the route's 1/h)", status)
	}
	for range 5 {
		resp, err := http.Get(base + "/fast/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("route fast: %s, want 200", resp.Status)
		}
	}
}

// postWait posts body to the wait endpoint of the server at base, and
// returns the answer's status and its JSON.
func postWait(t *testing.T, base, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(base+waitPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reply map[string]any
	json.NewDecoder(resp.Body).Decode(&reply)
	return resp.StatusCode, reply
}

// TestServeShutdown stops a server while one request is in flight and one
// waits: the first ends with the upstream's answer, the second is a 503
// and gives its token back.
func TestServeShutdown(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "done")
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	s, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, upstream: '%s', limit: 1/m burst 1, max_wait: 5m}\n", redisServer.Addr, upstream.URL))
	results := make(chan string, 2)
	get := func() {
		resp, err := http.Get(base + "/")
		if err != nil {
			results <- err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		results <- fmt.Sprintf("%d %s", resp.StatusCode, body)
	}
	go get()
	<-arrived
	go get()
	limiter, err := pace.NewRedis(redisServer.Client(t), pace.PerMinute(1).WithBurst(1))
	if err != nil {
		t.Fatal(err)
	}
	defer limiter.Close()
	waitedFor := func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		var late *pace.DeadlineError
		if err := limiter.Wait(ctx, "api|"+strings.TrimPrefix(upstream.URL, "http://"), 1); !errors.As(err, &late) {
			t.Fatalf("got %v, want a DeadlineError", err)
		}
		return late.Delay
	}
	for waitedFor() < 90*time.Second { // the second request booked the next token
		time.Sleep(10 * time.Millisecond)
	}
	done := make(chan error)
	go func() { done <- s.shutdown() }()
	if got := <-results; !strings.HasPrefix(got, "503 ") {
		t.Errorf("the waiting request got %q, want a 503", got)
	}
	if d := waitedFor(); d > 61*time.Second {
		t.Errorf("after the shutdown a new wait is %v, want the next token's (about 60 s): the waiting request's went back", d)
	}
	close(release)
	if got := <-results; got != "200 done" {
		t.Errorf("the request in flight got %q, want the upstream's 200 done", got)
	}
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestServeDocsConfig builds the configuration docs/serve.md shows.
func TestServeDocsConfig(t *testing.T) {
	page, err := os.ReadFile("../../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, found := strings.Cut(string(page), "```yaml\n")
	config, _, closed := strings.Cut(rest, "```")
	if !found || !closed {
		t.Fatal("docs/serve.md shows no YAML block")
	}
	t.Setenv("PACE_DOC_OPENAI_KEY", "sk-doc")
	t.Setenv("PACE_DOC_ANTHROPIC_KEY", "sk-ant-doc")
	config = strings.Replace(config, "redis: redis://127.0.0.1:6379/0\n", "", 1) // the embedded store
	if err := configError(config); err != nil {
		t.Fatalf("docs/serve.md's configuration: %v", err)
	}
}

func TestServeEstimates(t *testing.T) {
	config := routeConfig{Costs: "openai", MaxTokens: 4096}
	cases := map[string]struct {
		body string
		want pace.Costs
	}{
		"max_tokens":            {`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`, pace.Costs{"tokens": 19 + 100}},
		"max_completion_tokens": {`{"max_completion_tokens":50,"max_tokens":9}`, pace.Costs{"tokens": 11 + 50}},
		"the route's":           {`{"model":"m"}`, pace.Costs{"tokens": 4 + 4096}},
		"not JSON":              {`max_tokens=5`, pace.Costs{"tokens": 4 + 4096}},
		"capped at the burst":   {`{"max_tokens":1000000000}`, pace.Costs{"tokens": 6000}},
		"empty":                 {``, pace.Costs{"tokens": 1 + 4096}},
	}
	for name, tc := range cases {
		for _, length := range []int64{int64(len(tc.body)), -1} { // known, and chunked
			req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(tc.body))
			req.ContentLength = length
			ctx, err := withEstimate(req.Context(), req, config, map[string]int{"tokens": 6000}, headSize(req))
			if err != nil {
				t.Fatal(err)
			}
			got := estimated(req.WithContext(ctx))
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%s, length %d: estimated %v, want %v", name, length, got, tc.want)
			}
			if body, _ := io.ReadAll(req.Body); string(body) != tc.body {
				t.Errorf("%s, length %d: the body went on as %q, want it whole", name, length, body)
			}
		}
	}
}

func FuzzEstimate(f *testing.F) {
	f.Add(`{"max_tokens":100,"messages":[]}`, "2.5")
	f.Add(`{"max_output_tokens":-1}`, "250ms")
	f.Add(`{"max_tokens":1e99}`, "1e300")
	f.Fuzz(func(t *testing.T, body, wait string) {
		req := httptest.NewRequest("POST", "/", strings.NewReader(body))
		ctx, err := withEstimate(req.Context(), req, routeConfig{Costs: "anthropic", MaxTokens: 10}, map[string]int{"input": 1000}, headSize(req))
		if err != nil {
			t.Fatal(err)
		}
		for name, cost := range estimated(req.WithContext(ctx)) {
			if cost < 0 || (name == "input" && cost > 1000) {
				t.Fatalf("%s: %d", name, cost)
			}
		}
		if d, err := parseWait(wait); err == nil && d < 0 {
			t.Fatalf("parseWait(%q) = %v", wait, d)
		}
	})
}

// TestServeOperable asks /healthz and /metrics, and sends requests of
// each class and of none.
func TestServeOperable(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, path: /api/, upstream: '%s', limit: 100/s, class_header: X-Pace-Class}\n", redisServer.Addr, upstream.URL))
	for class, want := range map[string]int{"": 200, "critical": 200, "Batch": 200, "default": 200, "urgent": 400} {
		req, _ := http.NewRequest("GET", base+"/api/", nil)
		req.Header.Set("X-Pace-Class", class)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("class %q: %d, want %d", class, resp.StatusCode, want)
		}
	}
	for path, want := range map[string]string{
		"/healthz": "ok\n",
		"/metrics": `pace_decisions_total{otel_scope_name="github.com/fleetpace/pace",otel_scope_schema_url="",otel_scope_version="",pace_limiter="redis",pace_name="api",pace_result="granted"} 4`,
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), want) {
			t.Errorf("%s: %q, want %q in it", path, body, want)
		}
	}
}

// TestServeShadow: a route with shadow: true at 1/m burst 1 sends three
// requests at once, and its metrics record the waits pacing would have
// imposed: about a minute and two (a wait that passes max_wait, 90 s, is
// recorded refused, and goes too). Then the route enforcing, on the same
// Redis, lets its first request go at once.
func TestServeShadow(t *testing.T) {
	var n atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, path: /api/, upstream: '%s', limit: 1/m burst 1, max_wait: 90s, shadow: true}\n", redisServer.Addr, upstream.URL))
	start := time.Now()
	for range 3 {
		resp, err := http.Get(base + "/api/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("a shadow route's request: %s, want 200", resp.Status)
		}
	}
	took := time.Since(start)
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sum := regexp.MustCompile(`pace_wait_duration_seconds_sum\{[^}]*pace_name="api"[^}]*\} (\S+)`).FindStringSubmatch(string(body))
	refused := regexp.MustCompile(`pace_decisions_total\{[^}]*pace_name="api",pace_result="refused"\} (\d+)`).FindStringSubmatch(string(body))
	t.Logf("3 requests in %v, %d upstream; waits recorded: %v, refused: %v", took, n.Load(), sum, refused)
	if took > 2*time.Second || n.Load() != 3 {
		t.Errorf("3 requests on a shadow route took %v, %d reached the upstream; want at once, and all", took, n.Load())
	}
	if sum == nil || !strings.HasPrefix(sum[1], "59.") && !strings.HasPrefix(sum[1], "60") {
		t.Errorf("the waits recorded: %v, want a sum of about 60 s (0 and a minute)", sum)
	}
	if refused == nil || refused[1] != "1" {
		t.Errorf("refusals recorded: %v, want 1 (the third, 2 minutes away, past max_wait)", refused)
	}
	// The rollout's next step: the route enforcing, on the same Redis. The
	// shadow's bookings were its own: the first request goes at once.
	_, enforcing := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, path: /api/, upstream: '%s', limit: 1/m burst 1, max_wait: 90s}\n", redisServer.Addr, upstream.URL))
	req, _ := http.NewRequest(http.MethodGet, enforcing+"/api/", nil)
	req.Header.Set(maxWaitHeader, "1s")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the route enforcing after its shadow booked 3: %s, want 200 at once (a shadow's bookings are its own)", resp.Status)
	}
}

// TestServeIgnoreHolds: an upstream that answers its first request 429
// with Retry-After: 5. On a route that heeds holds, the next request is
// refused by pace at once (its wait would pass the client's X-Pace-Max-Wait
// of 1 s); on one with ignore_holds: true it goes. The embedded store.
func TestServeIgnoreHolds(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		var asked atomic.Int64
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if asked.Add(1) == 1 {
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusTooManyRequests)
			}
		}))
		defer upstream.Close()
		_, base := startServe(t, fmt.Sprintf("routes:\n  - {name: api, upstream: '%s', limit: 100/s, ignore_holds: %v}\n", upstream.URL, ignore))
		var statuses []int
		for range 2 {
			req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
			req.Header.Set(maxWaitHeader, "1s")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
		}
		want, wantAsked := []int{http.StatusTooManyRequests, http.StatusTooManyRequests}, int64(1)
		if ignore {
			want[1], wantAsked = http.StatusOK, 2
		}
		if !slices.Equal(statuses, want) || asked.Load() != wantAsked {
			t.Errorf("ignore_holds: %v: answered %v, the upstream asked %d times; want %v, %d", ignore, statuses, asked.Load(), want, wantAsked)
		}
	}
}

// TestServeReadsCompressedRefusals: a client that accepts gzip, deflate
// and br (Python's, Node's) gets the upstream's refusals whose bodies ask
// for a hold (Gemini's RetryInfo, GitHub's secondary limit) as pace serve
// asked the upstream for them: gzip alone, which Go's transport decodes.
// pace serve hears them as it hears plain ones: the next request is refused
// by pace at once (its wait passes the client's X-Pace-Max-Wait of 1 s),
// not sent; and the client reads the body the upstream wrote. The embedded
// store.
func TestServeReadsCompressedRefusals(t *testing.T) {
	bodies := map[string]string{
		"retryinfo": `{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]}}`,
		"secondary": `{"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`,
	}
	for name, body := range bodies {
		for _, accept := range []string{"gzip, deflate, br", "br", "deflate", "gzip"} {
			var asked atomic.Int64
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.Header.Get("Accept-Encoding"); got != "gzip" {
					t.Errorf("the upstream was asked for %q; want gzip alone, which pace reads", got)
				}
				if asked.Add(1) > 1 {
					return
				}
				status := http.StatusTooManyRequests
				if name == "secondary" {
					status = http.StatusForbidden
				}
				w.Header().Set("Content-Type", "application/json")
				compressed(w, r.Header.Get("Accept-Encoding"), status, body)
			}))
			defer upstream.Close()
			_, base := startServe(t, fmt.Sprintf("routes:\n  - {name: api, upstream: '%s', limit: 100/s}\n", upstream.URL))
			var statuses []int
			var first string
			for i := range 2 {
				req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
				req.Header.Set("Accept-Encoding", accept)
				req.Header.Set(maxWaitHeader, "1s")
				resp, err := http.DefaultTransport.RoundTrip(req) // no decoding of its own
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if i == 0 {
					first = decodeAs(t, resp.Header.Get("Content-Encoding"), got)
				}
				statuses = append(statuses, resp.StatusCode)
			}
			if asked.Load() != 1 || statuses[1] != http.StatusTooManyRequests || first != body {
				t.Errorf("%s, Accept-Encoding %q: answered %v, the upstream asked %d times, the first body %q; want the second refused by pace, the upstream asked once, the body as written",
					name, accept, statuses, asked.Load(), first)
			}
		}
	}
}

// compressed writes body with status, compressed as the first encoding of
// accept the test upstream knows (gzip, deflate) asks, else as it is.
func compressed(w http.ResponseWriter, accept string, status int, body string) {
	for _, enc := range strings.Split(accept, ",") {
		var zw io.WriteCloser
		switch strings.TrimSpace(enc) {
		case "gzip":
			zw = gzip.NewWriter(w)
		case "deflate":
			zw = zlib.NewWriter(w)
		default:
			continue
		}
		w.Header().Set("Content-Encoding", strings.TrimSpace(enc))
		w.WriteHeader(status)
		io.WriteString(zw, body)
		zw.Close()
		return
	}
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// decodeAs decodes b from the content encoding named ("" for none).
func decodeAs(t *testing.T, encoding string, b []byte) string {
	t.Helper()
	var r io.Reader
	var err error
	switch encoding {
	case "":
		return string(b)
	case "gzip":
		r, err = gzip.NewReader(bytes.NewReader(b))
	case "deflate":
		r, err = zlib.NewReader(bytes.NewReader(b))
	default:
		t.Fatalf("a body in %q", encoding)
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
