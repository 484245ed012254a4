package pace

import (
	"context"
	"errors"
)

// Allow reports whether cost units for key can go now, and books them if
// so: a Wait that books nothing and returns false when the request would
// have to wait at all (as rate.Limiter's AllowN does), for a caller that
// drops or defers work instead of waiting. Its error is one a Wait would
// return at once: a bad key or cost, or ErrUnavailable under FailClosed.
func (r *Redis) Allow(ctx context.Context, key string, cost int) (bool, error) {
	return allow(ctx, r, key, cost)
}

// Allow reports whether cost units for key can go now, and books them if
// so, as Redis.Allow does.
func (loc *Local) Allow(ctx context.Context, key string, cost int) (bool, error) {
	return allow(ctx, loc, key, cost)
}

// allow is Allow on l: a Wait under a budget of nothing.
func allow(ctx context.Context, l Limiter, key string, cost int) (bool, error) {
	err := l.Wait(WithWaitBudget(ctx, 0), key, cost)
	if errors.As(err, new(*DeadlineError)) {
		return false, nil
	}
	return err == nil, err
}
