package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Quiet stops go-redis from logging, for the rest of the test binary: the
// dial errors of the outages the tests cause themselves would read, in a
// test's output, as a broken checkout. What a test needs of a failure it
// reads from pace's events and errors.
func Quiet() { redis.SetLogger(silent{}) }

type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}
