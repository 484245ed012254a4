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
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// startBounded starts pace serve with one route to an upstream that
// answers ok to a request whose body came whole, under the bounds in
// extra (YAML lines), and returns its address.
func startBounded(t *testing.T, extra string) string {
	t.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := io.Copy(io.Discard, r.Body); err != nil || n < r.ContentLength {
			http.Error(w, fmt.Sprintf("a body cut short: %d of %d bytes, %v", n, r.ContentLength, err), http.StatusBadRequest)
			return
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(upstream.Close)
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\n%sroutes:\n  - {name: api, upstream: '%s', limit: 1000/s}\n", redisServer.Addr, extra, upstream.URL))
	return strings.TrimPrefix(base, "http://")
}

// TestServeClosesAnIdleConnection: a kept-alive connection idle for
// idle_timeout is closed (before, one was open still after 22 s).
func TestServeClosesAnIdleConnection(t *testing.T) {
	const idle = 300 * time.Millisecond
	addr := startBounded(t, fmt.Sprintf("idle_timeout: %v\n", idle))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /x HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	answered := time.Now()
	conn.SetReadDeadline(answered.Add(10 * idle))
	_, err = br.ReadByte()
	closed := time.Since(answered)
	if err != io.EOF || closed < idle*9/10 || closed > 5*idle {
		t.Errorf("the idle connection: %v after %v; want it closed (EOF) after the idle timeout of %v", err, closed, idle)
	}
}

// TestServeCutsATrickledBody: a body trickled a byte every 50 ms, slower
// than min_body_rate, is cut once body_timeout's grace is spent (before,
// one at a byte a second was held 21 s without an answer).
func TestServeCutsATrickledBody(t *testing.T) {
	const grace = 500 * time.Millisecond
	addr := startBounded(t, fmt.Sprintf("body_timeout: %v\n", grace))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n", addr)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			if _, err := conn.Write([]byte("x")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	conn.SetReadDeadline(start.Add(20 * grace))
	status := "no answer"
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil { // or the close
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		status = resp.Status + " " + string(body)
	}
	cut := time.Since(start)
	conn.Close()
	<-done
	t.Logf("%s after %v", status, cut)
	if cut < grace*9/10 || cut > 4*grace || strings.HasPrefix(status, "200") {
		t.Errorf("the trickled body: %s after %v; want it cut after the grace of %v, and soon", status, cut, grace)
	}
}

// TestServeServesANewClientAtTheCap: at max_connections, held by clients
// that sent nothing, a new client is served within a second: the
// connection idle longest is closed for it (before, 120 slow clients took
// all 128 descriptors and a new client timed out).
func TestServeServesANewClientAtTheCap(t *testing.T) {
	const most = 8
	addr := startBounded(t, fmt.Sprintf("max_connections: %d\n", most))
	for range most {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
	}
	client := &http.Client{Timeout: time.Second}
	start := time.Now()
	resp, err := client.Get("http://" + addr + "/x")
	if err != nil {
		t.Fatalf("a new client at the cap: %v after %v", err, time.Since(start))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a new client at the cap: %s, want 200", resp.Status)
	}
}

// TestEarned: the time a body's bytes earn, exact for the sizes bodies
// have, and never negative for those they could have (before, 10 GB at
// 1024 bytes a second overflowed to a deadline in the past).
func TestEarned(t *testing.T) {
	for _, tc := range []struct {
		read, rate int64
		want       time.Duration
	}{
		{0, 1024, 0},
		{512, 1024, 500 * time.Millisecond},
		{3 << 20, 1024, 3072 * time.Second},
		{10e9, 1024, 9765625 * time.Second},
		{1 << 62, 1, 100 * 365 * 24 * time.Hour},
	} {
		if got := earned(tc.read, tc.rate); got != tc.want {
			t.Errorf("earned(%d, %d) = %v, want %v", tc.read, tc.rate, got, tc.want)
		}
	}
}

// TestBuffer: the budget of bytes held for estimates gives what is left,
// once each, and takes back what is given back.
func TestBuffer(t *testing.T) {
	b := &buffer{left: 3}
	first := b.Take(2)
	if first == nil || b.Take(2) != nil {
		t.Fatal("took 2 of 3, then 2 more")
	}
	first()
	first()
	if b.left != 3 || b.Take(3) == nil {
		t.Errorf("given back twice: %d left, want 3", b.left)
	}
}
