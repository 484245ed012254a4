package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestServeProcessAtItsDescriptorLimit: pace serve as a process of its own
// that may open 128 files, with its default bounds (max_connections: the
// limit less 64). 120 clients connect and send half a request line each,
// then nothing; a new client is still served, within a second, and the
// connections idle longest were closed for the newer (before, 120 slow
// clients took all 128 descriptors and a new client timed out).
func TestServeProcessAtItsDescriptorLimit(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	r := startReplicaWithin(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, upstream: '%s', limit: 1000/s}\n", redisServer.Addr, upstream.URL), 128)
	addr := strings.TrimPrefix(r.URL, "http://")
	slow := make([]net.Conn, 120)
	for i := range slow {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("slow client %d: %v", i, err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n", addr)
		slow[i] = conn
	}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	start := time.Now()
	resp, err := client.Get(r.URL + "/")
	if err != nil {
		t.Fatalf("a new client beside 120 slow ones: %v after %v", err, time.Since(start))
	}
	resp.Body.Close()
	took := time.Since(start)
	// The process may yet be accepting the last slow clients, each closing
	// the one idle longest: each connection is read until a second from
	// now, which ends the held ones' reads at once. A connection closed
	// before the process read what its client sent ends in a reset, not
	// an EOF.
	closed, until := 0, time.Now().Add(time.Second)
	for _, conn := range slow {
		conn.SetReadDeadline(until)
		if _, err := conn.Read(make([]byte, 1)); err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
			closed++
		}
	}
	t.Logf("a new client served in %v (%s); %d of the 120 slow clients closed", took, resp.Status, closed)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a new client beside 120 slow ones: %s, want 200", resp.Status)
	}
	if closed < 120-64 {
		t.Errorf("%d of the 120 slow clients were closed, want %d at least (64 connections at most)", closed, 120-64)
	}
}

// TestServeProcessPinsItsBudget: pace serve as a process of its own, with
// its default bounds, on a costs route. 200 clients each send the headers
// and 1 MiB of a 2 MiB body, or all but 1 KiB of a 1 MiB body, or of a
// chunked one, then stall; the memory the process pins (its Go runtime's,
// after a collection) rises by 32 MB at most above what it pinned idle,
// after one request (before, 200 clients of the first kind pinned 231 MB). The bodies beyond
// max_buffered go on upstream, estimated by their length: the upstream
// sees them. Each connection with a body on its way up costs about 110 KB
// (net/http's buffers, goroutines): 18 MB for 200. The runtime's own
// figure, not the resident set, since the tests run with -race, whose
// shadow memory is five times the heap.
func TestServeProcessPinsItsBudget(t *testing.T) {
	const clients, sent = 200, 1 << 20
	var started atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"usage": {"total_tokens": 10}}`)
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	t.Setenv(replicaMemory, filepath.Join(t.TempDir(), "memory"))
	r := startReplica(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: llm, upstream: '%s', limits: {tokens: 1000000/s burst 1000}, costs: openai}\n", redisServer.Addr, upstream.URL))
	addr := strings.TrimPrefix(r.URL, "http://")
	resp, err := http.Post(r.URL+"/", "application/json", strings.NewReader(`{"max_tokens": 10}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	idle := r.memory(t)
	held := int64(defaultMaxBuffered / (sent - 1024)) // the most bodies the budget holds at once
	body, most := strings.Repeat("x", sent), strings.Repeat("x", sent-1024)
	stalled := []string{
		fmt.Sprintf("Content-Length: %d\r\n\r\n%s", 2*sent, body),
		fmt.Sprintf("Content-Length: %d\r\n\r\n%s", sent, most),
		fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s", len(most), most),
	}
	var wg sync.WaitGroup
	for i := range clients {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		wg.Go(func() {
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s", addr, stalled[i%len(stalled)])
		})
	}
	wg.Wait()
	// Every byte sent has left the clients; those that the process holds
	// are in it once it has read them: what it pins is read after the
	// upstream has seen the bodies it was given, and a second more.
	for deadline := time.Now().Add(10 * time.Second); started.Load() < clients-held && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second)
	pinned := r.memory(t)
	t.Logf("pinned: idle %.1f MB, %.1f MB with %d stalled bodies (%d reached the upstream)", float64(idle)/1e6, float64(pinned)/1e6, clients, started.Load())
	if started.Load() < clients-held {
		t.Errorf("%d bodies reached the upstream, want %d at least (those beyond the budget go on)", started.Load(), clients-held)
	}
	if pinned-idle > 32e6 {
		t.Errorf("the process pinned %.1f MB more with %d stalled bodies, want 32 MB at most", float64(pinned-idle)/1e6, clients)
	}
}

// TestServeStalledBodiesPinLittle: pace serve as a process of its own, on
// a costs route whose quota makes every request after the first wait a
// minute, past its max_wait: pace answers 429 before reading the body. 200
// clients each send the headers and 1 MiB of a 2 MiB body, then stall;
// the memory the process pins rises by 16 MB at most above what it pinned
// idle (before, 232.6 MB: the rest of each body, left on its connection, was
// read as a next request's line, up to net/http's 1 MiB of headers).
func TestServeStalledBodiesPinLittle(t *testing.T) {
	const clients, sent = 200, 1 << 20
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})) // no usage: the estimates stand
	defer upstream.Close()
	redisServer := redistest.Start(t)
	t.Setenv(replicaMemory, filepath.Join(t.TempDir(), "memory"))
	r := startReplica(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: llm, upstream: '%s', limits: {tokens: 1000/m burst 1000}, costs: openai, max_wait: 1s}\n", redisServer.Addr, upstream.URL))
	addr := strings.TrimPrefix(r.URL, "http://")
	resp, err := http.Post(r.URL+"/", "application/json", strings.NewReader(`{"max_tokens": 2000}`)) // the burst, all of it
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	idle := r.memory(t)
	stalled := fmt.Sprintf("Content-Length: %d\r\n\r\n%s", 2*sent, strings.Repeat("x", sent))
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range clients {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		wg.Go(func() {
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s", addr, stalled)
			if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil && resp.StatusCode == http.StatusTooManyRequests {
				refused.Add(1)
			}
		})
	}
	wg.Wait() // each answered, a wait of a minute past its second
	if refused.Load() != clients {
		t.Errorf("%d of %d refused, want all", refused.Load(), clients)
	}
	pinned := r.memory(t)
	t.Logf("pinned: idle %.1f MB, %.1f MB with %d stalled bodies refused", float64(idle)/1e6, float64(pinned)/1e6, clients)
	if pinned-idle > 16e6 {
		t.Errorf("the process pinned %.1f MB more with %d stalled bodies refused, want 16 MB at most", float64(pinned-idle)/1e6, clients)
	}
}

// replicaMemory names the file a replica writes the memory its Go runtime
// holds to (reportMemory), when it is set.
const replicaMemory = "PACE_SERVE_TEST_MEMORY"

// reportMemory writes to path, at each SIGUSR1, the memory the Go runtime
// holds from the system once it has collected its garbage and given back
// what it can (all it mapped, less the heap it gave back): what the
// process pins.
func reportMemory(path string) {
	asked := make(chan os.Signal, 1)
	signal.Notify(asked, syscall.SIGUSR1)
	samples := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	for range asked {
		debug.FreeOSMemory()
		metrics.Read(samples)
		os.WriteFile(path+".new", fmt.Appendf(nil, "%d", samples[0].Value.Uint64()-samples[1].Value.Uint64()), 0o600)
		os.Rename(path+".new", path)
	}
}

// memory asks the replica, started with replicaMemory set, what memory it
// pins (reportMemory), in bytes.
func (r *replica) memory(t *testing.T) (pinned int64) {
	t.Helper()
	path := os.Getenv(replicaMemory)
	os.Remove(path)
	r.cmd.Process.Signal(syscall.SIGUSR1)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if text, err := os.ReadFile(path); err == nil {
			if _, err := fmt.Sscan(string(text), &pinned); err != nil {
				t.Fatalf("%s: %q: %v", path, text, err)
			}
			return pinned
		}
	}
	t.Fatalf("the replica wrote no memory to %s in 5 s", path)
	return 0
}
