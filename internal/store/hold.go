package store

import (
	"context"
	"time"
)

// Hold holds key for d from now, by Redis's clock, and tells the fleet on
// channel. It returns whether the hold outlasts the one in place, when it
// ends, and when the hold before it ended (0 for none), in microseconds of
// Redis's clock.
func (s *Store) Hold(ctx context.Context, key string, d time.Duration, channel string) (changed bool, end, before int64, err error) {
	keys := []string{s.HoldKey(key)}
	var reply [3]int64
	if err := int64Reply(s.calls.Run(ctx, holdScript, keys, d.Microseconds(), channel, key), reply[:]); err != nil {
		return false, 0, 0, s.fail(key, "hold", keys, err)
	}
	return reply[0] == 1, reply[1] + d.Microseconds(), reply[2], nil
}

// HeldUntil returns when key's latest hold ends, in microseconds of Redis's
// clock, or 0.
func (s *Store) HeldUntil(ctx context.Context, key string) (int64, error) {
	keys := []string{s.HoldKey(key)}
	end, err := s.calls.Run(ctx, heldScript, keys).Int64()
	if err != nil {
		return 0, s.fail(key, "held", keys, err)
	}
	return end, nil
}

// Line returns the turn of a request of key that its class deferred, whose
// wait comes within its horizon after earliest, and whose cost takes turn
// to refill (see lua/line.lua).
func (s *Store) Line(ctx context.Context, key string, earliest, turn time.Duration) (time.Duration, error) {
	_, at, err := s.LineAt(ctx, key, earliest, turn)
	return at, err
}

// LineAt is Line, and the TIME the script used.
func (s *Store) LineAt(ctx context.Context, key string, earliest, turn time.Duration) (now int64, at time.Duration, err error) {
	keys := []string{s.prefix + "{" + key + "}" + DeferredSuffix}
	var reply [2]int64
	if err := int64Reply(s.calls.Run(ctx, lineScript, keys, max(earliest, 0).Microseconds(), turn.Microseconds()), reply[:]); err != nil {
		return 0, 0, s.fail(key, "line", keys, err)
	}
	return reply[0], Microseconds(reply[1]), nil
}
