package fleetsim

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	n       int // calls made, pipelines aside
}

func (c *calls) answered(name string, begun time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
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
