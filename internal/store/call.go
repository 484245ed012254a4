package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Caller runs Redis calls, each with a timeout of its own, whatever the
// request's context and whatever the options of the client: the one its
// round trips set (roundTrips).
//
// A client that applies context deadlines to its socket I/O (go-redis with
// ContextTimeoutEnabled) gets the call directly, with a deadline. Any other
// client (go-redis's default, or a type pace cannot inspect) might block for
// its ReadTimeout and retries, seconds in all, so its call runs on a goroutine
// of its own and the Caller stops waiting for it at the deadline.
type Caller struct {
	client  redis.Scripter
	fn      functions
	trips   roundTrips
	guarded bool // the client may ignore context deadlines
	// Answers counts the calls Redis answered without an error: the
	// failover's breaker ends a row of failures at one.
	Answers atomic.Uint64

	// deadline is a context whose deadline lies timeout to 1.25*timeout
	// ahead, renewed every quarter timeout and shared by the calls that start
	// meanwhile, so that a call's timeout costs no allocation of its own.
	deadline atomic.Pointer[sharedDeadline]
}

type sharedDeadline struct {
	ctx     context.Context
	cancel  context.CancelFunc // left to the context's own timer, which ends it at the deadline
	renewAt time.Time
	timeout time.Duration
	backoff uint32 // the round trips' backoff when it was set

	// refusal asks once, for every call that expires under the
	// deadline, whether Redis refuses connections (Caller.refused).
	refusal sync.Once
	refused bool
}

// NewCaller returns the caller of client, whose calls get at least floor.
func NewCaller(client redis.Scripter, floor time.Duration) *Caller {
	c := &Caller{client: client, trips: roundTrips{floor: floor}, guarded: !appliesContextDeadlines(client)}
	c.fn.client, _ = client.(functionCaller)
	return c
}

// Abandon ends the calls under way, each with its expiry: an outage is
// confirmed, and whatever they answer now would come too late to decide
// by (a call given a second of timeout just before Redis froze would hold
// its caller that second more, while the outage paces the others). The
// next call sets a deadline of its own. A probe's call (RunLong) goes on.
func (c *Caller) Abandon() {
	if d := c.deadline.Swap(nil); d != nil {
		d.cancel()
	}
}

// Timeout is the timeout of a call that begins now, as the round trips
// set it.
func (c *Caller) Timeout() time.Duration {
	timeout, _ := c.trips.timeout()
	return timeout
}

// appliesContextDeadlines reports whether client bounds its socket I/O by a
// context's deadline.
func appliesContextDeadlines(client redis.Scripter) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// callContext is the context of one Redis call: the values of the request's
// context, for the client's tracing hooks, with the call's own deadline
// instead of the request's.
type callContext struct {
	context.Context                 // the shared deadline
	values          context.Context // the request
}

// Value returns the request context's value for key.
func (c callContext) Value(key any) any { return c.values.Value(key) }

// context returns the context of a call that begins now, and its deadline's.
func (c *Caller) context(ctx context.Context, now time.Time) (context.Context, *sharedDeadline) {
	d := c.deadline.Load()
	timeout, backoff := c.trips.timeout()
	// Renewed when due, when the round trips cut the timeout by more than
	// a quarter (as from the ceiling to the first answer's), or when it
	// backed off.
	if d == nil || !now.Before(d.renewAt) || d.timeout > timeout+timeout/4 || d.backoff != backoff {
		dctx, cancel := context.WithDeadline(context.Background(), now.Add(timeout+timeout/4))
		d = &sharedDeadline{ctx: dctx, cancel: cancel, renewAt: now.Add(timeout / 4), timeout: timeout, backoff: backoff}
		c.deadline.Store(d)
	}
	return callContext{Context: d.ctx, values: ctx}, d
}

// done takes the outcome of a call under d that began at start, and
// returns its error: its round trip, when Redis answered, and an answer
// without an error; its expiry, which backs the timeout off, when Redis,
// reachable, did not answer in time (see IsExpiry).
func (c *Caller) done(d *sharedDeadline, start time.Time, err error) error {
	switch {
	case err == nil:
		c.Answers.Add(1)
		c.trips.answered(time.Since(start))
	case isRedisError(err):
		c.trips.answered(time.Since(start))
	case d.ctx.Err() != nil:
		d.refusal.Do(func() { d.refused = c.refused() })
		if d.refused {
			return err
		}
		c.trips.expired(d.backoff)
		return expiry{err, d.timeout}
	}
	return err
}

// refused reports whether Redis refuses a new connection now, when the
// client says where it is: a call that expired then waited for the
// connections go-redis redials until the deadline (and says only that it
// passed), not for an answer.
func (c *Caller) refused() bool {
	client, ok := c.client.(*redis.Client)
	if !ok {
		return false
	}
	o := client.Options()
	ctx, cancel := context.WithTimeout(context.Background(), c.trips.floor)
	defer cancel()
	conn, err := o.Dialer(ctx, o.Network, o.Addr)
	if err == nil {
		conn.Close()
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// An expiry is the error of a call that Redis, reachable, did not answer
// within its timeout: a Redis slower than the timeout, or one gone silent.
type expiry struct {
	err     error
	timeout time.Duration // the call's
}

func (e expiry) Error() string { return e.err.Error() }
func (e expiry) Unwrap() error { return e.err }

// IsExpiry reports whether err is a call's expiry: Redis, reachable, did
// not answer within the call's timeout. The next call waits twice as long.
func IsExpiry(err error) bool {
	var e expiry
	return errors.As(err, &e)
}

// AtCeiling reports whether err is the expiry of a call given the longest
// timeout, MaxCallTimeout: a Redis that no call can wait longer for.
func AtCeiling(err error) bool {
	var e expiry
	return errors.As(err, &e) && e.timeout >= MaxCallTimeout
}

// isRedisError reports whether err is an error that Redis answered with.
// (Apart, so that a call that succeeds allocates no target for errors.As.)
func isRedisError(err error) bool {
	var redisErr redis.Error
	return errors.As(err, &redisErr)
}

// Run runs script with the call's timeout.
func (c *Caller) Run(ctx context.Context, script *script, keys []string, args ...any) *redis.Cmd {
	return c.RunKeys(ctx, script, keyArgs{names: keys}, args...)
}

// RunKeys runs script, on keys some of which a caller keeps boxed, with
// the call's timeout.
func (c *Caller) RunKeys(ctx context.Context, script *script, keys keyArgs, args ...any) *redis.Cmd {
	start := time.Now()
	cctx, d := c.context(ctx, start)
	var cmd *redis.Cmd
	if !c.guarded && d.backoff == 0 {
		cmd = c.fn.run(cctx, c.client, script, keys, args...)
	} else {
		// Guarded: a client that ignores context deadlines; or, after an
		// expiry, a call that an outage's beginning may abandon (go-redis
		// reads on past a cancelled context until its deadline).
		done := make(chan *redis.Cmd, 1)
		go func() { done <- c.fn.run(cctx, c.client, script, keys, args...) }()
		select {
		case cmd = <-done:
		case <-cctx.Done():
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(d.timedOut())
		}
	}
	if err := cmd.Err(); err != nil {
		cmd.SetErr(c.done(d, start, err))
	} else {
		c.done(d, start, nil)
	}
	return cmd
}

// RunWithin runs script within ctx alone, without the call's timeout: a
// check that may wait for a first connection (a TLS handshake, a distant
// Redis) as long as its caller lets it.
func (c *Caller) RunWithin(ctx context.Context, script *script, keys []string, args ...any) *redis.Cmd {
	if !c.guarded {
		return c.fn.run(ctx, c.client, script, keyArgs{names: keys}, args...)
	}
	done := make(chan *redis.Cmd, 1)
	go func() { done <- c.fn.run(ctx, c.client, script, keyArgs{names: keys}, args...) }()
	select {
	case cmd := <-done:
		return cmd
	case <-ctx.Done():
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(context.Cause(ctx))
		return cmd
	}
}

// RunLong runs script as Run does, and lets the call go on in the
// background after its timeout, up to MaxCallTimeout: a late answer is a
// round trip of its own (no retransmission), so a Redis that has become
// slower than the timeout is measured, and the next call waits for it. A
// late answer is not the caller's: late, unless nil, is called with it, to
// undo what the script did. The failover's probe runs so, once a
// cool-down.
func (c *Caller) RunLong(ctx context.Context, late func(*redis.Cmd), script *script, keys keyArgs, args ...any) *redis.Cmd {
	start := time.Now()
	timeout, backoff := c.trips.timeout()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(MaxCallTimeout, timeout+timeout/4))
	done, abandoned := make(chan *redis.Cmd), make(chan struct{})
	go func() {
		defer cancel()
		cmd := c.fn.run(lctx, c.client, script, keys, args...)
		c.done(&sharedDeadline{ctx: lctx, timeout: timeout, backoff: backoff}, start, cmd.Err())
		select {
		case done <- cmd:
		case <-abandoned:
			if late != nil && cmd.Err() == nil {
				late(cmd)
			}
		}
	}()
	wait := time.NewTimer(timeout + timeout/4)
	defer wait.Stop()
	select {
	case cmd := <-done:
		return cmd
	case <-wait.C:
		close(abandoned)
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(timedOut(timeout))
		return cmd
	}
}

// Pipeline runs the commands that fill sends, in one round trip, with the
// call's timeout.
func (c *Caller) Pipeline(ctx context.Context, p redis.Pipeliner) ([]redis.Cmder, error) {
	start := time.Now()
	cctx, d := c.context(ctx, start)
	cmds, err := c.exec(cctx, d, p)
	return cmds, c.done(d, start, err)
}

// exec runs p within cctx, whose deadline is d's.
func (c *Caller) exec(cctx context.Context, d *sharedDeadline, p redis.Pipeliner) ([]redis.Cmder, error) {
	if !c.guarded {
		return p.Exec(cctx)
	}
	type result struct {
		cmds []redis.Cmder
		err  error
	}
	done := make(chan result, 1)
	go func() {
		cmds, err := p.Exec(cctx)
		done <- result{cmds, err}
	}()
	select {
	case r := <-done:
		return r.cmds, r.err
	case <-cctx.Done():
		return nil, d.timedOut()
	}
}

func (d *sharedDeadline) timedOut() error { return timedOut(d.timeout) }

// timedOut is the error of a call that Redis did not answer within timeout.
func timedOut(timeout time.Duration) error {
	return fmt.Errorf("pace: Redis did not answer within the call timeout of %v", timeout)
}

// MaxCallTimeout is the longest a Redis call may be given: beyond it, a
// Redis that answers is of no use to the requests that wait for it.
const MaxCallTimeout = time.Second

// roundTrips measures this limiter's round trips to Redis and sets the
// timeout of its calls from them, much as TCP sets its retransmission
// timeout (RFC 6298): from the smoothed round trip and its mean deviation.
// A call may have to open a connection first, whose handshake (go-redis's
// HELLO, then its CLIENT SETINFO) takes two round trips more, so a call
// gets three smoothed round trips and four deviations, with the configured
// timeout (WithCallTimeout) as its floor and as the least margin above
// them, and MaxCallTimeout as its ceiling. A Redis in another zone, or a
// machine so loaded that its calls take 40 ms, is then slow, not away.
// Until a first call answers, the timeout is the ceiling: a distant Redis
// is not taken for a lost one before it has been heard. A call that times
// out is no sample (as Karn's algorithm has it): it says nothing of the
// round trip; but it doubles the timeout, up to the ceiling, as each
// expiry of TCP's timer does (RFC 6298, 5.5), so that a Redis whose round
// trips jump (a failover to another zone, a congested path) is waited for
// by the next call instead of taken for lost call after call. The first
// answer after sets the timeout from its round trip alone. The calls that
// expire together, under one timeout, double it once. It is safe for
// concurrent use.
type roundTrips struct {
	floor time.Duration
	// measured packs the smoothed round trip (high 32 bits) and its mean
	// deviation (low 32 bits), in microseconds; zero until the first answer.
	measured atomic.Uint64
	// backoff is how many times the timeout has doubled since the last
	// answer.
	backoff atomic.Uint32
}

// maxBackoff bounds the doublings: 2^10 times the least timeout is past
// any ceiling.
const maxBackoff = 10

// timeout returns the timeout of a call that begins now, and its backoff
// (see expired).
func (r *roundTrips) timeout() (time.Duration, uint32) {
	ceiling, backoff := max(MaxCallTimeout, r.floor), r.backoff.Load()
	m := r.measured.Load()
	if m == 0 {
		return ceiling, backoff
	}
	srtt, rttvar := time.Duration(m>>32)*time.Microsecond, time.Duration(uint32(m))*time.Microsecond
	return min((3*srtt+max(r.floor, 4*rttvar))<<backoff, ceiling), backoff
}

// expired takes the expiry of a call whose timeout had backoff: the first
// of the calls under that timeout doubles it.
func (r *roundTrips) expired(backoff uint32) {
	if backoff < maxBackoff {
		r.backoff.CompareAndSwap(backoff, backoff+1)
	}
}

// answered takes the round trip of a call that Redis answered, with a
// reply or an error of its own. The first after an expiry starts the
// measurement anew, as the first of all does (RFC 6298, 5.7): the round
// trips smoothed before the expiry are of another link.
func (r *roundTrips) answered(rtt time.Duration) {
	anew := r.backoff.Load() != 0 && r.backoff.Swap(0) != 0
	sample := uint64(min(max(rtt, time.Microsecond), MaxCallTimeout) / time.Microsecond)
	for {
		old := r.measured.Load()
		next := sample<<32 | sample/2 // the first: its deviation half of it
		if old != 0 && !anew {
			srtt, rttvar := old>>32, uint64(uint32(old))
			dev := max(srtt, sample) - min(srtt, sample)
			rttvar = (3*rttvar + dev) / 4 // β = 1/4
			srtt = (7*srtt + sample) / 8  // α = 1/8
			next = max(srtt, 1)<<32 | rttvar
		}
		if r.measured.CompareAndSwap(old, next) {
			return
		}
	}
}
