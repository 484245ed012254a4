package store

import (
	"context"
	"fmt"
	"time"
)

// TokenLease is what the token lease script leased (see lua/tokenlease.lua):
// Tokens (0 for none) that may go from Begin to End after Now, its Redis
// TIME in microseconds.
type TokenLease struct {
	Tokens     int64
	Begin, End time.Duration
	Now        int64
}

// LeaseTokens leases up to n tokens of key's bucket to this process, for a
// span of at least span from now, beginning within budget. Only a quota of
// one bucket leases.
func (s *Store) LeaseTokens(ctx context.Context, key string, n int64, span, budget time.Duration) (TokenLease, error) {
	if !s.oneBucket {
		return TokenLease{}, nil
	}
	keys := s.bookingKeys(key)
	args := []any{s.limitArgs[1], s.limitArgs[2], n, span.Microseconds(), budget.Microseconds(), flag(s.announcer.due(key)), s.ownLimit}
	var reply [4]int64
	err := int64Reply(s.calls.Run(ctx, tokenLeaseScript, keys, args...), reply[:])
	refill := s.limits[0].Span * int64(s.limits[0].Count) // no lease's span is longer
	if err == nil && (reply[0] < 0 || reply[0] > n || reply[1] < 0 ||
		reply[0] > 0 && (reply[1] > budget.Microseconds() || reply[2] < reply[1] || reply[2]-reply[1] > refill)) {
		err = fmt.Errorf("replied %v, want [tokens begin end now] with 0 <= tokens <= %d, begin within %v, and end after it by %d µs at most", reply, n, budget, refill)
	}
	if err != nil {
		return TokenLease{}, s.fail(key, "tokenlease", keys, err)
	}
	return TokenLease{Tokens: reply[0], Begin: Microseconds(reply[1]), End: Microseconds(reply[2]), Now: reply[3]}, nil
}
