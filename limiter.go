package pace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// A Limiter paces events by key. Local and Redis implement it; so can a user
// type, to put its own pacing behind a Transport.
type Limiter interface {
	// Wait blocks until cost units for key are granted, and returns nil; or
	// until ctx ends, and returns an error that wraps ctx's error; or, at
	// once, returns an error when the wait is impossible: a bad key or cost,
	// or a wait that would pass ctx's deadline (a *DeadlineError).
	// A wait that does not end in a grant charges nothing.
	Wait(ctx context.Context, key string, cost int) error
}

// A DeadlineError reports a wait that pace refused, without booking anything,
// because it would end after the context's deadline or the limiter's maximum
// wait. It wraps context.DeadlineExceeded.
type DeadlineError struct {
	Key    string
	Cost   int
	Delay  time.Duration // how long the wait would have been
	Budget time.Duration // how long the caller could wait
}

// Error says which wait was refused, how long it would have been and how
// long the caller could wait.
func (e *DeadlineError) Error() string {
	if e.Budget >= MaxDelay {
		return fmt.Sprintf("pace: key %s: a wait of %v for cost %d exceeds MaxDelay, the longest wait a limiter books (%v)", store.QuoteKey(e.Key), e.Delay, e.Cost, MaxDelay)
	}
	return fmt.Sprintf("pace: key %s: a wait of %v for cost %d exceeds the %v the caller may wait", store.QuoteKey(e.Key), e.Delay, e.Cost, e.Budget)
}

// Unwrap returns context.DeadlineExceeded.
func (e *DeadlineError) Unwrap() error { return context.DeadlineExceeded }

// refuse tells o that limiter refused a wait of delay for a caller who could
// wait budget, and returns the *DeadlineError that says so.
func refuse(ctx context.Context, o Observer, e Event, delay, budget time.Duration) error {
	err := &DeadlineError{Key: e.Key, Cost: e.Cost, Delay: delay, Budget: budget}
	e.Kind, e.Delay, e.Err = EventRefuse, delay, err
	o.emit(ctx, e)
	return err
}

// MaxDelay is the longest wait a limiter books, about a century: a caller
// without a deadline whose wait would be longer is refused with a
// *DeadlineError, as if its deadline were MaxDelay away. It keeps every
// delay a time.Duration (which ends at 292 years) and every time the Redis
// scripts handle an exact integer.
const MaxDelay = store.MaxDelay

// A requestError is a wait that no limiter could ever grant: a bad key or
// cost. Retrying it is pointless.
type requestError struct{ msg string }

// Error returns the message that names the bad value.
func (e *requestError) Error() string { return e.msg }

// checkWait reports a wait that cannot begin: a key or cost that no wait
// could ever grant (maxCost is the smallest burst or window count of the
// limits), or a context that has already ended.
func checkWait(ctx context.Context, maxCost int, key string, cost int) error {
	switch {
	case key == "":
		return &requestError{fmt.Sprintf("pace: empty key (cost %d)", cost)}
	case cost < 1:
		return &requestError{fmt.Sprintf("pace: key %s: cost %d is below 1", store.QuoteKey(key), cost)}
	case cost > maxCost:
		return &requestError{fmt.Sprintf("pace: key %s: cost %d exceeds the burst %d", store.QuoteKey(key), cost, maxCost)}
	case ctx.Err() != nil:
		return endedBefore(ctx, key)
	}
	return nil
}

// endedBefore is the error of a wait for key whose ctx ended before it
// began.
func endedBefore(ctx context.Context, key string) error {
	return fmt.Errorf("pace: key %s: context ended before the wait: %w", store.QuoteKey(key), context.Cause(ctx))
}

// waitBudget is how long a caller may wait from now: until ctx's deadline,
// maxWait (when positive), ctx's own budget (WithWaitBudget) or MaxDelay,
// whichever is soonest, never below zero.
func waitBudget(ctx context.Context, maxWait time.Duration, now time.Time) time.Duration {
	budget := MaxDelay
	if maxWait > 0 {
		budget = min(budget, maxWait)
	}
	if own, ok := ctx.Value(waitBudgetKey{}).(time.Duration); ok {
		budget = min(budget, max(own, 0))
	}
	if deadline, ok := ctx.Deadline(); ok {
		budget = min(budget, max(deadline.Sub(now), 0))
	}
	return budget
}

// A KeyError reports that what Redis holds for one key is not what pace
// wrote there (a value of another type or form, or a time further ahead
// than any pace books). It concerns that key alone: Redis is not failing,
// and other keys go on. Deleting the Redis key, or letting it expire,
// heals it. Its fields are
// Key (the key, as the caller named it), RedisKey (the Redis key at fault)
// and Problem (what is wrong there); its Error names all three.
type KeyError = store.KeyError

// sleep waits for delay on one timer, or until ctx ends, and then returns an
// error that wraps ctx's error.
func sleep(ctx context.Context, key string, delay time.Duration) error {
	if delay <= 0 {
		return nil
	}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return waitEnded(ctx, key, delay)
	}
}

// waitEnded is the error of a wait of delay for key that ctx ended.
func waitEnded(ctx context.Context, key string, delay time.Duration) error {
	return fmt.Errorf("pace: key %s: wait of %v ended early: %w", store.QuoteKey(key), delay, context.Cause(ctx))
}

type waitBudgetKey struct{}

// WithWaitBudget returns a copy of ctx under which a wait is granted only
// if it ends within d: what a limiter's WithMaxWait is, for one request.
// A longer wait fails at once, booking nothing, as one past ctx's
// deadline does (a *DeadlineError that says the wait); d of 0 grants only
// what is free now. Unlike a deadline, it does not end ctx: the request's
// work goes on under it.
func WithWaitBudget(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, waitBudgetKey{}, d)
}

// allow is Allow on l: a Wait under a budget of nothing.
func allow(ctx context.Context, l Limiter, key string, cost int) (bool, error) {
	err := l.Wait(WithWaitBudget(ctx, 0), key, cost)
	if errors.As(err, new(*DeadlineError)) {
		return false, nil
	}
	return err == nil, err
}
