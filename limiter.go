package pace

import (
	"context"
	"fmt"
	"time"
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
	return fmt.Sprintf("pace: key %q: a wait of %v for cost %d exceeds the %v the caller may wait", e.Key, e.Delay, e.Cost, e.Budget)
}

// Unwrap returns context.DeadlineExceeded.
func (e *DeadlineError) Unwrap() error { return context.DeadlineExceeded }

// refuse tells o that limiter refused a wait of delay for a caller who could
// wait budget, and returns the *DeadlineError that says so.
func refuse(ctx context.Context, o Observer, limiter, key string, cost int, delay, budget time.Duration) error {
	err := &DeadlineError{Key: key, Cost: cost, Delay: delay, Budget: budget}
	o.emit(ctx, Event{Kind: EventRefuse, Limiter: limiter, Key: key, Cost: cost, Delay: delay, Err: err})
	return err
}

// noBudget is the budget of a caller who may wait as long as it takes.
const noBudget time.Duration = -1

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
		return &requestError{fmt.Sprintf("pace: key %q: cost %d is below 1", key, cost)}
	case cost > maxCost:
		return &requestError{fmt.Sprintf("pace: key %q: cost %d exceeds the burst %d", key, cost, maxCost)}
	case ctx.Err() != nil:
		return fmt.Errorf("pace: key %q: context ended before the wait: %w", key, context.Cause(ctx))
	}
	return nil
}

// waitBudget is how long a caller may wait from now: until ctx's deadline or
// maxWait (when positive), whichever is sooner, never below zero; noBudget
// when neither applies.
func waitBudget(ctx context.Context, maxWait time.Duration, now time.Time) time.Duration {
	budget := noBudget
	if maxWait > 0 {
		budget = maxWait
	}
	if deadline, ok := ctx.Deadline(); ok {
		left := max(deadline.Sub(now), 0)
		if budget == noBudget || left < budget {
			budget = left
		}
	}
	return budget
}

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
		return fmt.Errorf("pace: key %q: wait of %v ended early: %w", key, delay, context.Cause(ctx))
	}
}
