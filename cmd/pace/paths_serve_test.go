package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestServeResolvesPaths sends, on a raw connection, paths that a proxy
// which matches prefixes on what it is sent would pass on with the
// route's API key: encoded dot segments that climb out of the upstream's
// base path, and variants of a path under a rule of 1/m. What climbs out
// is a 400 that reaches no upstream (and what resolves out of the route's
// prefix is no longer the route's); the upstream receives each other path
// resolved; and every variant of the rule's path is the rule's (encoded
// slashes too, which the upstream decodes): one goes, the others wait past
// their 100 ms.
func TestServeResolvesPaths(t *testing.T) {
	t.Setenv("PACE_TEST_KEY", "route-secret")
	var mu sync.Mutex
	var seen []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.EscapedPath())
		mu.Unlock()
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - name: api\n    path: /api/\n    upstream: '%s/v1'\n    limit: 100/s\n    api_key_env: PACE_TEST_KEY\n    rules:\n      - {name: search, path: /v1/search, limit: 1/m}\n",
		redisServer.Addr, upstream.URL))
	addr := strings.TrimPrefix(base, "http://")
	for _, path := range []string{
		"/api/%2e%2e/%2e%2e/etc/passwd", "/api/%2E%2E/%2E%2E/etc/passwd", "/api/..%2f..%2fetc/passwd",
		"/api/%2e%2e%2f%2e%2e%2fetc/passwd", "/api/x/../../../etc/passwd", "/api/..%5c..%5cetc",
	} {
		if status := rawGet(t, addr, path); status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", path, status)
		}
	}
	if status := rawGet(t, addr, "/api/%2e%2e/x"); status != http.StatusNotFound { // /x: no route's
		t.Errorf("/api/%%2e%%2e/x: %d, want 404", status)
	}
	mu.Lock()
	if len(seen) > 0 {
		t.Errorf("the upstream saw %q, want nothing", seen)
	}
	mu.Unlock()
	for path, want := range map[string]string{
		"/api/x/%2e%2e/models":         "/v1/models",
		"/api//models/./a":             "/v1/models/a",
		"/api/projects/g%2Fp/jobs":     "/v1/projects/g%2Fp/jobs",
		"/api/models/x/%2E%2E/%2e/gpt": "/v1/models/gpt",
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		if status := rawGet(t, addr, path); status != http.StatusOK {
			t.Errorf("%s: %d, want 200", path, status)
		}
		mu.Lock()
		if len(seen) != 1 || seen[0] != want {
			t.Errorf("%s: the upstream saw %q, want %s", path, seen, want)
		}
		mu.Unlock()
	}
	granted := 0
	variants := []string{"/api/search", "/api//search", "/api/./search", "/api/x/../search", "/api/%2e/search", "/api/x/%2E%2E/search",
		"/api/%2Fsearch/q6", "/api/%2fsearch", "/api/x/%2F..%2F%2Fsearch"}
	for _, path := range variants {
		if rawGet(t, addr, path, maxWaitHeader+": 100ms") == http.StatusOK {
			granted++
		}
	}
	if granted != 1 {
		t.Errorf("%d of %d variants of the rule's path granted in a second, want 1 (1/m)", granted, len(variants))
	}
}

// rawGet sends GET path with headers on a new connection to addr, as
// written, and returns the status of the answer.
func rawGet(t *testing.T, addr, path string, headers ...string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", path, addr)
	for _, h := range headers {
		fmt.Fprintf(conn, "%s\r\n", h)
	}
	fmt.Fprint(conn, "\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
