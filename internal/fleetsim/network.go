package fleetsim

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
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
	toServer, toClient := newLink(s.c, 1), newLink(s.c, 2)
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

// faults are the case's faults on Redis, each over a span of the run.
type faults struct {
	kind        string
	from, until time.Time
}

// newFaults places c's fault from a third of the run on, for a sixth of it
// (a stall or a kill for at most 2 s, as an operator's restart takes); a
// paused process, for pauseLength.
func newFaults(c Case, start time.Time) *faults {
	f := &faults{kind: c.Faults}
	if f.kind != "none" {
		f.from = start.Add(c.Duration / 3)
		f.until = f.from.Add(min(c.Duration/6, 2*time.Second))
	}
	if f.kind == "pause" {
		f.until = f.from.Add(pauseLength)
	}
	return f
}

// pauseLength is how long a paused process is away: as long as a process
// starved of CPU, or in a long garbage collection, on a loaded machine.
const pauseLength = 300 * time.Millisecond

// paused is how long process proc, paused at now, stays away (0 when it
// is not).
func (f *faults) paused(now time.Time, proc int) time.Duration {
	return max(f.pausedUntil(now, proc).Sub(now), 0)
}

// pausedUntil is when process proc, paused at now, goes on: only the first
// process pauses.
func (f *faults) pausedUntil(now time.Time, proc int) time.Time {
	if proc == 0 && f.during(now, "pause") {
		return f.until
	}
	return time.Time{}
}

func (f *faults) during(now time.Time, kind string) bool {
	return f.kind == kind && !now.Before(f.from) && now.Before(f.until)
}

// down reports whether a killed Redis refuses connections at now.
func (f *faults) down(now time.Time) bool { return f.during(now, "kill") }

// frozenUntil is when a frozen Redis answers again, if it is frozen at now.
func (f *faults) frozenUntil(now time.Time) time.Time {
	if f.during(now, "stall") {
		return f.until
	}
	return time.Time{}
}

// slowLinkDelay is what a slow link adds to each trip.
const slowLinkDelay = 40 * time.Millisecond

// extra is what a slow link adds to a trip at now.
func (f *faults) extra(now time.Time) time.Duration {
	if f.during(now, "slowlink") {
		return slowLinkDelay
	}
	return 0
}

// bunching is how much a pause can bunch arrivals beyond what the links
// do: it holds a process's granted requests and lets them go at once.
func (f *faults) bunching() time.Duration {
	if f.kind == "pause" {
		return pauseLength
	}
	return 0
}

// loseReply reports whether a reply at now is lost, with its connection:
// one in five, drawn from the trip it took, while the fault lasts.
func (f *faults) loseReply(now time.Time, draw uint64) bool {
	return f.during(now, "lostreply") && draw%5 == 0
}

// errClosed is what the upstream's link says after the run.
var errClosed = errors.New("fleetsim: the run is over")

// workerKey is the context key of the name of the worker whose request a
// Redis call serves.
type workerKey struct{}

// stagger is a go-redis hook that delays each command by up to
// staggerRange, drawn from the worker that asks it (or its process) and
// the instant: workers that ask at one instant write at instants of their
// own, in an order the seed decides, not the scheduler. It also measures
// how long each worker's calls take to be answered, from the first of the
// attempts that failed before (see calls).
type stagger struct {
	link  *link
	proc  string
	calls *calls
}

func (s stagger) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s stagger) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := s.wait(ctx)
		begun := time.Now()
		err := next(ctx, cmd)
		s.calls.answered(name, begun, err)
		return err
	}
}

func (s stagger) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.wait(ctx)
		return next(ctx, cmds)
	}
}

// wait staggers the call of ctx's worker, and returns the worker's name.
func (s stagger) wait(ctx context.Context) string {
	name, _ := ctx.Value(workerKey{}).(string)
	if name == "" {
		name = s.proc
	}
	sleep(ctx, time.Duration(s.link.hash(time.Now(), []byte(name))%uint64(staggerRange)))
	return name
}

// calls keeps the longest a worker's call took to be answered, counted
// from its first attempt when it was asked again after failures (a call
// whose answer was lost is asked again, and finds its booking): a grant
// reaches its process that long after Redis made it, at most.
type calls struct {
	mu      sync.Mutex
	failing map[string]time.Time // the first attempt of each worker's call that has failed so far
	longest time.Duration
}

func (c *calls) answered(name string, begun time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if first, ok := c.failing[name]; ok {
		begun = first
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		c.failing[name] = begun
		return
	}
	delete(c.failing, name)
	c.longest = max(c.longest, time.Since(begun))
}

// staggerRange bounds stagger's delays: wide enough that two of a few
// dozen workers seldom draw one instant.
const staggerRange = 64 * time.Microsecond
