package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

// pace serve holds API keys, so it bounds what each client may hold of it,
// by default (docs/serve.md, "Limits and security"): the time a client may
// take to send its request's head and its body, or to read the answer; the
// time a kept-alive connection may idle; the connections open at once,
// below the process's descriptors; and the bytes of request bodies held
// for estimates.
type bounds struct {
	HeaderTimeout  time.Duration `yaml:"header_timeout"`
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	BodyTimeout    time.Duration `yaml:"body_timeout"`
	MinBodyRate    int64         `yaml:"min_body_rate"`
	SendTimeout    time.Duration `yaml:"send_timeout"`
	MaxConnections int           `yaml:"max_connections"`
	MaxBuffered    int64         `yaml:"max_buffered"`
}

// The bounds' defaults.
const (
	defaultHeaderTimeout = 10 * time.Second
	defaultIdleTimeout   = 60 * time.Second
	defaultBodyTimeout   = 30 * time.Second
	defaultMinBodyRate   = 1024 // bytes a second
	defaultSendTimeout   = 60 * time.Second
	defaultMaxBuffered   = 4 << 20
	// spareDescriptors are kept from the connections' share of the
	// descriptor limit: listeners, Redis's connections, the upstreams'.
	spareDescriptors = 64
)

// fill sets the defaults of what b leaves out.
func (b *bounds) fill() {
	fill := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	fill(&b.HeaderTimeout, defaultHeaderTimeout)
	fill(&b.IdleTimeout, defaultIdleTimeout)
	fill(&b.BodyTimeout, defaultBodyTimeout)
	fill(&b.SendTimeout, defaultSendTimeout)
	if b.MinBodyRate == 0 {
		b.MinBodyRate = defaultMinBodyRate
	}
	if b.MaxBuffered == 0 {
		b.MaxBuffered = defaultMaxBuffered
	}
	if b.MaxConnections == 0 {
		b.MaxConnections = descriptorShare()
	}
}

// check returns what is wrong with b.
func (b *bounds) check() []error {
	var errs []error
	for field, d := range map[string]time.Duration{"header_timeout": b.HeaderTimeout, "idle_timeout": b.IdleTimeout, "body_timeout": b.BodyTimeout, "send_timeout": b.SendTimeout} {
		if d < 10*time.Millisecond {
			errs = append(errs, fmt.Errorf("%s %v: want 10ms or more", field, d))
		}
	}
	for field, n := range map[string]int64{"min_body_rate": b.MinBodyRate, "max_connections": int64(b.MaxConnections), "max_buffered": b.MaxBuffered} {
		if n < 1 {
			errs = append(errs, fmt.Errorf("%s %d: want 1 or more", field, n))
		}
	}
	return errs
}

// descriptorShare is the connections the process's descriptor limit
// leaves room for, beside spareDescriptors; 64 at least.
func descriptorShare() int {
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil || limit.Cur > 1<<20 {
		return 1 << 14
	}
	return max(int(limit.Cur)-spareDescriptors, 64)
}

// guard passes each request to next with its path resolved
// (resolvePath), its body bound to come at MinBodyRate (after a
// BodyTimeout's grace), and each write of its answer to reach the client
// within SendTimeout; and answers 400 to a path it refuses.
func (b *bounds) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := resolveRequestPath(r); err != nil {
			writeError(w, http.StatusBadRequest, err, 0)
			return
		}
		rc := http.NewResponseController(w)
		var body *timedBody
		if r.Body != nil && r.Body != http.NoBody {
			body = &timedBody{ReadCloser: r.Body, rc: rc, start: time.Now(), grace: b.BodyTimeout, rate: b.MinBodyRate}
			r.Body = body
		}
		tw := &timedWriter{ResponseWriter: w, rc: rc, timeout: b.SendTimeout}
		next.ServeHTTP(tw, r)
		if body != nil && body.cut != nil && !tw.wrote {
			writeError(w, http.StatusRequestTimeout, body.cut, 0) // the connection closes after it
		}
	})
}

// timedBody is a request body that must come at rate bytes a second at
// least, after grace: each Read may wait until then and no longer (the
// connection's read deadline), as nginx's client_body_timeout does for
// one read, and a body trickled a byte at a time is cut too.
type timedBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int64
	read  int64
	cut   error // why the body was cut, if it was
}

func (b *timedBody) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(b.start.Add(b.grace + earned(b.read, b.rate)))
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("request body: slower than %d bytes a second after %v: %w", b.rate, b.grace, err)
		b.cut = err
	}
	return n, err
}

// earned is the time read bytes earn at rate bytes a second: in whole
// seconds (a century at most) and the rest, since bytes times a second
// overflows a Duration past 9.2 GB.
func earned(read, rate int64) time.Duration {
	return time.Duration(min(read/rate, 100*365*24*3600))*time.Second + time.Duration(read%rate)*time.Second/time.Duration(rate)
}

// timedWriter is an answer each write of which must reach the client
// within timeout (the connection's write deadline), as nginx's
// send_timeout: a client that reads nothing for that long is cut.
type timedWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	wrote   bool // a header or a byte of the answer
}

func (w *timedWriter) WriteHeader(status int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.wrote = true
	w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.ResponseWriter.Write(p)
}

func (w *timedWriter) Flush() {
	w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection (a flush, an
// upgrade's hijack).
func (w *timedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// connCap holds at most max connections open at once, over the listeners
// it caps: at the cap, it closes the connection idle longest (kept alive
// between requests, or yet to send its first request's head), so that a
// new client is served while slow ones hold the rest; with none idle, a
// new connection waits for one to close.
type connCap struct {
	max int

	mu    sync.Mutex
	freed *sync.Cond
	open  map[*cappedConn]time.Time // idle since, or zero while a request is under way
}

func newConnCap(max int) *connCap {
	c := &connCap{max: max, open: make(map[*cappedConn]time.Time)}
	c.freed = sync.NewCond(&c.mu)
	return c
}

// listener returns l, its connections counted under the cap.
func (c *connCap) listener(l net.Listener) net.Listener { return cappedListener{l, c} }

type cappedListener struct {
	net.Listener
	cap *connCap
}

func (l cappedListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := l.cap
	capped := &cappedConn{Conn: conn, cap: c}
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.open) >= c.max {
		if !c.closeIdlest() {
			c.freed.Wait()
		}
	}
	c.open[capped] = time.Now()
	return capped, nil
}

// closeIdlest closes the connection idle longest, if any.
func (c *connCap) closeIdlest() bool {
	var idlest *cappedConn
	var since time.Time
	for conn, t := range c.open {
		if !t.IsZero() && (idlest == nil || t.Before(since)) {
			idlest, since = conn, t
		}
	}
	if idlest == nil {
		return false
	}
	idlest.Conn.Close() // the server sees it fail, and closes it
	delete(c.open, idlest)
	return true
}

// state follows the server's view of conn (http.Server.ConnState).
func (c *connCap) state(conn net.Conn, s http.ConnState) {
	capped, ok := conn.(*cappedConn)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.open[capped]; !ok {
		return
	}
	switch s {
	case http.StateActive, http.StateHijacked:
		c.open[capped] = time.Time{}
	case http.StateIdle:
		c.open[capped] = time.Now()
	case http.StateClosed:
		delete(c.open, capped)
		c.freed.Signal()
	}
}

// cappedConn is a connection of a connCap, which it leaves when closed.
type cappedConn struct {
	net.Conn
	cap  *connCap
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.cap.mu.Lock()
		defer c.cap.mu.Unlock()
		if _, ok := c.cap.open[c]; ok {
			delete(c.cap.open, c)
			c.cap.freed.Signal()
		}
	})
	return err
}

// buffer is the budget of bytes of bodies held, across all requests: of
// request bodies for estimates, and of what the Transports keep of
// responses (pace.WithBodyBudget).
type buffer struct {
	mu   sync.Mutex
	left int64
}

// Take takes n bytes of the budget, if they are left, and returns the
// func that gives them back; nil if they are not (see pace.WithBodyBudget).
func (b *buffer) Take(n int64) func() {
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

// copyBufferSize is the buffer a request body goes up a plain connection
// to its upstream through. net.TCPConn's ReadFrom, which net/http's
// Transport copies a body with, allocates 32 KiB for each, and a client
// that stalls mid-body pins it for as long as it stalls.
const copyBufferSize = 8 << 10

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// pooledCopies makes t's connections to its upstreams copy request bodies
// through a pooled buffer of copyBufferSize.
func pooledCopies(t *http.Transport) {
	dial := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return pooledCopyConn{c}, nil
	}
}

// pooledCopyConn is a connection that copies what it reads from through a
// pooled buffer.
type pooledCopyConn struct{ net.Conn }

// ReadFrom copies r to the connection through a pooled buffer, hiding
// r's WriteTo, which would bring its own.
func (c pooledCopyConn) ReadFrom(r io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{c.Conn}, struct{ io.Reader }{r}, *buf)
}
