// Package store runs pace's Lua scripts on Redis: it names the keys of a
// quota, passes each script its arguments as plain data and reads its
// replies, and it times each call (Caller). It knows nothing of limiters,
// failover or observers: the package pace decides what to call, and when.
package store

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store runs pace's scripts on Redis for one quota: it names the keys,
// passes the arguments and reads the replies. It has no breaker and no
// observer. Every error it returns is either a *KeyError, about one key's
// data, or a failure of Redis, which the limiter's failover handles.
type Store struct {
	calls      *Caller
	prefix     string
	limits     []Limit
	suffixes   []string                  // each limit's key is prefix{key} and its suffix
	gapped     []string                  // each limit's suffix, then its gaps key's
	booked     []string                  // the suffixes of the keys a booking reads: its limits', its hold's, its rate's, and, for one bucket, the limits the fleet paces it at and whether they differ
	limitArgs  []any                     // each limit's kind, span and count, boxed once
	oneBucket  bool                      // the quota is one bucket: reserve.lua, not quota.lua
	ownLimit   any                       // for one bucket, its interval and burst as lua/limits.lua records them, "A B "
	announcer  announcer                 // for one bucket, which bookings announce its limit
	lastBooked atomic.Pointer[bookedKey] // the keys of the key booked last, boxed (see bookedKeys)
	sliding    bool                      // some limit is a sliding window, whose grants need ids
	member     string                    // names this limiter's grants in sliding windows
	requestIDs atomic.Uint64
}

// Kind is a limit's kind, as the scripts number it.
type Kind int64

// The kinds of limit.
const (
	Bucket        Kind = 1 // a token bucket
	SlidingWindow Kind = 2 // count per period, in every period wherever it starts
	FixedWindow   Kind = 3 // count per period, in periods aligned to the clock
)

// A Limit is one limit of a quota, as the scripts take it.
type Limit struct {
	Kind   Kind
	Span   int64  // a bucket's interval (the time one token takes to refill), or a window's period, in microseconds
	Count  int    // a bucket's burst, or a window's count
	Suffix string // what its Redis key adds to prefix{key}: "" for a quota of one unnamed bucket
	// Windows, if set, gives a fixed window's windows in Span's place: the
	// times the windows around now start at, as window_at in lua/common.lua
	// reads them (a calendar's days or months, of unequal lengths).
	Windows func() string
}

// New returns the store of a quota of limits, whose calls go through calls,
// whose keys start with prefix, and whose grants in sliding windows member
// names.
func New(calls *Caller, prefix, member string, limits []Limit) *Store {
	s := &Store{calls: calls, prefix: prefix, limits: limits, member: member}
	for _, l := range limits {
		s.limitArgs = append(s.limitArgs, int64(l.Kind), l.Span, int64(l.Count))
		s.sliding = s.sliding || l.Kind == SlidingWindow
		s.suffixes = append(s.suffixes, l.Suffix)
		s.gapped = append(s.gapped, l.Suffix, l.Suffix+GapsSuffix)
	}
	s.booked = append(slices.Clone(s.suffixes), HoldSuffix, RateSuffix)
	s.oneBucket = len(limits) == 1 && limits[0].Kind == Bucket
	if s.oneBucket {
		s.booked = append(s.booked, LimitsSuffix, DifferSuffix) // see lua/limits.lua
		s.ownLimit = fmt.Sprintf("%d %d ", limits[0].Span, limits[0].Count)
		s.announcer = newAnnouncer()
	}
	return s
}

// span is limit i's span as the scripts take it: its Span, or its windows
// around now.
func (s *Store) span(i int) any {
	if windows := s.limits[i].Windows; windows != nil {
		return windows()
	}
	return s.limitArgs[3*i+1]
}

// Keys a user can name never contain ReservedInNames after the hash tag;
// the keys pace keeps for itself (gaps, holds, heartbeats) always do. So no
// key or limit name can reach them. The suffixes are the layout of what
// pace keeps beside a key's limits (PREFIX{KEY}SUFFIX), which pace inspect
// reads too; a fleet's heartbeats are under the tag FleetTag
// (PREFIX{fleet}#NAME).
const (
	ReservedInNames = "{}#"
	FleetTag        = "fleet"
	GapsSuffix      = "#gaps"     // the bookings given back with later ones behind them
	HoldSuffix      = "#hold"     // the key's hold
	SettledSuffix   = "#settled:" // the mark of a reservation settled
	RateSuffix      = "#rate"     // the key's rate after refusals
	LimitsSuffix    = "#limits"   // the limits the fleet paces a one-bucket key at (see lua/limits.lua)
	DifferSuffix    = "#differ"   // there while the fleet paces a one-bucket key at different limits
	CallSuffix      = "#call:"    // the record of a booking's call
	SlotsSuffix     = "#slots:"   // the holders of a cap's slots
	LineSuffix      = "#line:"    // its line of waiters
	WaitersSuffix   = "#waiters:" // their leases
	DeferredSuffix  = "#deferred" // the line of requests their class deferred
)

// SteeredFields is how many whole numbers a bucket's value holds once the
// upstream's counters have steered it (lua/common.lua says what each is);
// a bucket never steered holds one, its schedule.
const SteeredFields = 12

// Keys are the Redis keys of key's limits, each followed by its gaps key when
// withGaps.
func (s *Store) Keys(key string, withGaps bool) []string {
	if withGaps {
		return s.tagged(key, s.gapped)
	}
	return s.tagged(key, s.suffixes)
}

// bookingKeys are the Redis keys a booking of key reads: its limits', then
// its hold's and its rate's.
func (s *Store) bookingKeys(key string) []string { return s.tagged(key, s.booked) }

// tagged returns key's Redis key with each of suffixes, all under one hash
// tag (one Redis Cluster slot), with room for one key more (a hold's or a
// settlement's). Their text is one allocation: a booking's keys are made
// on every call.
func (s *Store) tagged(key string, suffixes []string) []string {
	base := len(s.prefix) + len(key) + len("{}")
	var text strings.Builder
	text.Grow(len(suffixes)*base + lenSum(suffixes))
	for _, suffix := range suffixes {
		text.WriteString(s.prefix)
		text.WriteByte('{')
		text.WriteString(key)
		text.WriteByte('}')
		text.WriteString(suffix)
	}
	all, at := text.String(), 0
	keys := make([]string, len(suffixes), len(suffixes)+1)
	for i, suffix := range suffixes {
		keys[i], at = all[at:at+base+len(suffix)], at+base+len(suffix)
	}
	return keys
}

// lenSum is the sum of the lengths of texts.
func lenSum(texts []string) (n int) {
	for _, t := range texts {
		n += len(t)
	}
	return n
}

// rateKey is the Redis key of key's rate after refusals.
func (s *Store) rateKey(key string) string { return s.prefix + "{" + key + "}" + RateSuffix }

// HoldKey is the Redis key that says when key's latest hold ends.
func (s *Store) HoldKey(key string) string { return s.prefix + "{" + key + "}" + HoldSuffix }

// BucketKey is the Redis key of key's first limit.
func (s *Store) BucketKey(key string) string { return s.Keys(key, false)[0] }

// MaxLimits is the most limits one Quota may hold.
const MaxLimits = 8

// LimitCosts are a request's costs under each limit of its quota, by the
// limit's position.
type LimitCosts [MaxLimits]int

// LimitSet is a set of a quota's limits, by position: bit i for limit i.
type LimitSet uint8

// Check runs the check script within ctx (see lua/check.lua), and returns
// Redis's clock, in microseconds.
func (s *Store) Check(ctx context.Context) (int64, error) {
	return s.calls.RunWithin(ctx, checkScript, nil).Int64()
}

// Announce notes in Redis that this store's limit paces key, as its
// bookings do, without booking (see lua/announce.lua): nothing for a
// quota of several limits, which bookings do not compare.
func (s *Store) Announce(ctx context.Context, key string) error {
	if !s.oneBucket {
		return nil
	}
	keys := []string{s.prefix + "{" + key + "}" + LimitsSuffix, s.prefix + "{" + key + "}" + DifferSuffix, s.prefix + "{" + key + "}"}
	if err := s.calls.Run(ctx, announceScript, keys, s.limitArgs[1], s.limitArgs[2], s.ownLimit).Err(); err != nil {
		return s.fail(key, "announce", keys, err)
	}
	return nil
}

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
	_, err := shortInt64Reply(cmd, dst, len(dst))
	return err
}

// shortInt64Reply reads a script's reply of len(dst) integers, or of least
// (its last items, all 0, left off: see lua/record.lua's booking_reply),
// into dst, the rest of dst 0, and returns how many it read.
func shortInt64Reply(cmd *redis.Cmd, dst []int64, least int) (int, error) {
	val, err := cmd.Result()
	if err != nil {
		return 0, err
	}
	items, ok := val.([]any)
	if !ok || len(items) != least && len(items) != len(dst) {
		return 0, fmt.Errorf("replied %v, want %d integers", val, len(dst))
	}
	for i, item := range items {
		if dst[i], ok = item.(int64); !ok {
			return 0, fmt.Errorf("replied %v, want %d integers", val, len(dst))
		}
	}
	clear(dst[len(items):])
	return len(items), nil
}
