package fleetsim

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// A link is one way of the simulated network: each trip takes the
// latency and a jitter of up to the case's, drawn from a hash of the
// seed, the link's way, the instant the trip begins and who makes it (a
// worker's name), never from a source that goroutines draw from in turn:
// whichever goroutine the scheduler runs first, a trip takes the same
// time, and a seed replays its run. (Redis's connections carry no name: a
// worker's calls reach them at instants of their own, see stagger.)
type link struct {
	latency, jitter time.Duration
	seed, way       uint64
}

func newLink(c Case, way uint64) *link {
	return &link{latency: c.Latency, jitter: c.Jitter, seed: c.Seed, way: way}
}

// newRedisLink is a way of Redis's link.
func newRedisLink(c Case, way uint64) *link {
	return &link{latency: c.RedisLatency, jitter: c.RedisJitter, seed: c.Seed, way: way}
}

// trip is how long a trip that who begins at now takes.
func (l *link) trip(now time.Time, who []byte) time.Duration {
	if l.jitter == 0 {
		return l.latency
	}
	return l.latency + time.Duration(l.hash(now, who)%uint64(l.jitter+1))
}

// hash draws a number for who at now on l.
func (l *link) hash(now time.Time, who []byte) uint64 {
	h := fnv.New64a()
	var head [24]byte
	binary.LittleEndian.PutUint64(head[0:], l.seed)
	binary.LittleEndian.PutUint64(head[8:], l.way)
	binary.LittleEndian.PutUint64(head[16:], uint64(now.UnixNano()))
	h.Write(head[:])
	h.Write(who)
	return h.Sum64()
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// redisServer is the embedded store behind the simulated network, and the
// faults the case puts on it.
type redisServer struct {
	store  *miniredis.Miniredis
	faults *faults
	c      Case

	mu    sync.Mutex
	conns map[*delayedConn]struct{}
}

func newRedisServer(c Case, f *faults) (*redisServer, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)      // keys expire on the virtual clock
	conn, err := m.Dial() // starts the store without a listener
	if err != nil {
		return nil, err
	}
	conn.Close()
	return &redisServer{store: m, faults: f, c: c, conns: make(map[*delayedConn]struct{})}, nil
}

// errRefused is a dial to a Redis that is down.
var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// dialer returns the go-redis Dialer of process proc: it connects a pipe
// to the store whose two ways are links of their own. It takes no time:
// pace dials under a sync.Once, which a synctest bubble does not take for
// durably blocked.
func (s *redisServer) dialer(proc int) func(context.Context, string, string) (net.Conn, error) {
	return func(context.Context, string, string) (net.Conn, error) { return s.dial(proc) }
}

func (s *redisServer) dial(proc int) (net.Conn, error) {
	if s.faults.down(time.Now()) {
		return nil, errRefused
	}
	toServer, toClient := newRedisLink(s.c, 1), newRedisLink(s.c, 2)
	client, server := net.Pipe()
	cc := newDelayedConn(client, toServer, s.faults, false, proc)
	sc := newDelayedConn(server, toClient, s.faults, true, proc)
	cc.peer, sc.peer = sc, cc
	s.mu.Lock()
	s.conns[cc] = struct{}{}
	s.mu.Unlock()
	s.store.Server().ServeConn(sc)
	return cc, nil
}

// kill closes every connection, as a Redis that dies does.
func (s *redisServer) kill() {
	s.mu.Lock()
	conns := s.conns
	s.conns = make(map[*delayedConn]struct{})
	s.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// close ends the store and every connection.
func (s *redisServer) close() {
	s.kill()
	s.store.Close()
}

// A delayedConn is one end of a pipe whose writes reach the other end a
// trip of its link later, in order; a fault may hold them (a frozen
// Redis), slow them, or drop a reply and the connection with it.
type delayedConn struct {
	net.Conn
	link      *link
	faults    *faults
	fromRedis bool
	proc      int // the client's process
	peer      *delayedConn

	mu      sync.Mutex
	queue   []packet
	wake    chan struct{}
	closed  bool
	started bool
	closing chan struct{} // closed by Close
	last    time.Time     // when the last packet is due
}

type packet struct {
	at   time.Time
	data []byte
}

func newDelayedConn(c net.Conn, l *link, f *faults, fromRedis bool, proc int) *delayedConn {
	return &delayedConn{Conn: c, link: l, faults: f, fromRedis: fromRedis, proc: proc, wake: make(chan struct{}, 1), closing: make(chan struct{})}
}

// Write queues b for delivery a trip from now, after what is queued.
func (c *delayedConn) Write(b []byte) (int, error) {
	now := time.Now()
	at := now.Add(c.link.trip(now, nil) + c.faults.extra(now))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	if at.Before(c.last) {
		at = c.last
	}
	c.last = at
	c.queue = append(c.queue, packet{at: at, data: append([]byte(nil), b...)})
	if !c.started {
		c.started = true
		go c.deliver()
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return len(b), nil
}

// deliver writes the queued packets to the pipe as each falls due.
func (c *delayedConn) deliver() {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		if len(c.queue) == 0 {
			c.mu.Unlock()
			select {
			case <-c.wake:
			case <-c.closing:
			}
			continue
		}
		p := c.queue[0]
		c.mu.Unlock()
		if !c.sleepUntil(p.at) {
			return
		}
		now := time.Now()
		if thaw := c.faults.frozenUntil(now); !c.fromRedis && !c.sleepUntil(thaw) {
			return // a frozen Redis reads its commands when it thaws
		}
		if !c.sleepUntil(c.faults.pausedUntil(now, c.proc)) {
			return // a paused process neither sends nor reads
		}
		if c.fromRedis && c.faults.loseReply(now, c.link.hash(now, nil)) {
			c.Close()
			return
		}
		c.mu.Lock()
		c.queue = c.queue[1:]
		c.mu.Unlock()
		if _, err := c.Conn.Write(p.data); err != nil {
			c.Close()
			return
		}
	}
}

// sleepUntil sleeps until t, and reports whether the connection is still
// open then.
func (c *delayedConn) sleepUntil(t time.Time) bool {
	if d := time.Until(t); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-c.closing:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closed
}

// Close closes both ends, and stops delivering.
func (c *delayedConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	c.mu.Unlock()
	err := c.Conn.Close()
	if c.peer != nil {
		c.peer.Close()
	}
	return err
}
