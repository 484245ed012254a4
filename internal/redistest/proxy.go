package redistest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback that forwards to a target address and
// can hold every chunk of data for a set latency, in both directions: a slow
// network between a client and Redis; or swallow Redis's replies: lost
// answers.
type Proxy struct {
	Addr    string // where clients connect
	target  string
	latency atomic.Int64 // nanoseconds
	swallow atomic.Int64 // replies to drop
	ln      net.Listener
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
}

// StartProxy starts a Proxy to target and stops it when the test ends.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// SetLatency makes the proxy hold each chunk for d before passing it on.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// SwallowReplies makes the proxy drop the next n chunks that Redis sends:
// for a client that sends one command at a time on a connection, n replies
// lost after Redis ran their commands.
func (p *Proxy) SwallowReplies(n int) { p.swallow.Store(int64(n)) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.pipe(server, client, nil)
		go p.pipe(client, server, &p.swallow)
	}
}

// track records a connection pair so that close can end it; false once the
// proxy is closed.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst, holding each chunk for the latency, and
// drops chunks while swallow, if not nil, counts any down.
func (p *Proxy) pipe(dst, src net.Conn, swallow *atomic.Int64) {
	defer p.wg.Done()
	defer p.untrack(dst, src)
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d)
			}
			if swallow != nil && swallow.Add(-1) >= 0 {
				continue
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// untrack closes a connection pair and forgets it.
func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
