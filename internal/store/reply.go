package store

import (
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// Microseconds converts a script's microseconds to a Duration, saturated
// rather than wrapped should a value ever lie beyond 292 years.
func Microseconds(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// int64Reply reads a script's reply of len(dst) integers into dst, without
// allocating. A reply of another shape is an error, never a panic.
func int64Reply(cmd *redis.Cmd, dst []int64) error {
	val, err := cmd.Result()
	if err != nil {
		return err
	}
	items, ok := val.([]any)
	if !ok || len(items) != len(dst) {
		return fmt.Errorf("replied %v, want %d integers", val, len(dst))
	}
	for i, item := range items {
		if dst[i], ok = item.(int64); !ok {
			return fmt.Errorf("replied %v, want %d integers", val, len(dst))
		}
	}
	return nil
}
