package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestServeUpgrades: an upgraded connection (here an echo protocol, as a
// WebSocket is one) passes through a plain route, an in_flight route and
// a costs route alike (before, the last two answered 502: "101 switching
// protocols response with non-writable body"), and on the in_flight route
// holds its slot until it closes: a request meanwhile waits past its
// 100 ms, one after goes.
func TestServeUpgrades(t *testing.T) {
	t.Setenv("PACE_TEST_KEY", "route-secret")
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		rw.Flush()
		io.Copy(conn, rw)
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: plain, path: /plain/, upstream: '%[2]s', limit: 100/s}\n  - {name: capped, path: /capped/, upstream: '%[2]s', limit: 100/s, in_flight: 1}\n  - {name: llm, path: /llm/, upstream: '%[2]s', limits: {tokens: 100000/m}, costs: openai}\n",
		redisServer.Addr, upstream.URL))
	addr := strings.TrimPrefix(base, "http://")
	for _, route := range []string{"plain", "capped", "llm"} {
		conn := upgrade(t, addr, "/"+route+"/ws")
		for _, msg := range []string{"hello", "again"} {
			fmt.Fprint(conn, msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(conn, got); err != nil || string(got) != msg {
				t.Errorf("%s: echoed %q, %v; want %q", route, got, err, msg)
			}
		}
		if route == "capped" {
			if status := rawGet(t, addr, "/capped/x", maxWaitHeader+": 100ms"); status != http.StatusTooManyRequests {
				t.Errorf("capped: a request while the upgraded connection is open: %d, want 429 (its slot held)", status)
			}
		}
		conn.Close()
		if route == "capped" {
			if status := rawGet(t, addr, "/capped/x", maxWaitHeader+": 2s"); status != http.StatusOK {
				t.Errorf("capped: a request after the upgraded connection closed: %d, want 200", status)
			}
		}
	}
}

// upgrade opens a connection to addr and upgrades it to the echo protocol
// at path.
func upgrade(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", path, addr)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %s %s, want 101", path, resp.Status, body)
	}
	return bufferedConn{br, conn}
}

// bufferedConn is a connection whose reads come through a bufio.Reader
// that may hold what came after an answer's head.
type bufferedConn struct {
	r *bufio.Reader
	net.Conn
}

func (c bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
