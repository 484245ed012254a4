package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Request is what a booking needs of a request: its key, its cost under
// each limit, whether it will be settled and which of its costs are
// estimates, whether it is the failover's probe, whose call may answer
// late (see Caller.RunLong), the number of its booking's call (see
// Reserve; 0 for a new one), the slot it takes with its booking, if any,
// and whether it is booked anew, its booking displaced by a hold or a
// retime (its key's rate counts it once: see lua/rate.lua). A request of a
// pool names its keys instead of Key (see lua/pick.lua): it is booked on
// the one that can go soonest, asked from Pool[First] on.
type Request struct {
	Key       string
	Costs     LimitCosts
	Settled   bool
	Estimated LimitSet
	Probe     bool
	Call      uint64
	Take      SlotTake
	Pool      []string
	First     int
	Again     bool
}

// SlotTake is the slot of a cap of requests in flight that a booking
// takes with it, in the same call (see lua/take.lua): the request's id,
// and the cap; none when Cap is nil.
type SlotTake struct {
	ID  string
	Cap *SlotCap
}

// Booking is what the reserve script decided.
type Booking struct {
	Granted   bool
	Delay     time.Duration
	Now       int64            // the Redis TIME of the decision, in microseconds
	Finishes  [MaxLimits]int64 // each bucket's schedule time after the booking (0 for windows)
	Booked    [MaxLimits]int64 // each steered bucket's count of units booked after the booking (else 0)
	Listening bool             // the key's rate listens for a success (see internal/steer)
	Recovered bool             // the key's rate was dropped, back at the configured one
	ID        string           // the booking's id: its call's record, its grants in sliding windows, its settlement
	Costs     LimitCosts
	// Estimated is the limits whose costs are a reservation's estimates
	// that their buckets' CEILINGs did not count (see lua/common.lua): not
	// those of a bucket no counters steered at the booking, whose schedule
	// counted the estimate, where a CEILING begins.
	Estimated LimitSet
	SlotBusy  bool // the request's Take found no slot free, and nothing was booked
	Pick      int  // the key of the request's Pool booked, or that would have been, by its index
	// Other is the limit another process paces the key at, one bucket's
	// interval (microseconds) and burst, when they disagree (see
	// lua/limits.lua): zero when all agree, or for a quota of several.
	Other struct{ Interval, Burst int64 }
}

// unsteered is the set of limits whose buckets no counters steered at a
// booking: those whose count of units booked is 0 (booked).
func unsteered(booked []int64) (set LimitSet) {
	for i, units := range booked {
		if units == 0 {
			set |= 1 << i
		}
	}
	return set
}

// Due is when the request goes, by Redis's clock, in microseconds.
func (b Booking) Due() int64 { return b.Now + b.Delay.Microseconds() }

// Reserve runs the reserve script once: it books request q under every
// limit, for a caller who cannot go sooner than notBefore from now, unless
// the wait would exceed budget. Its call is q's, or a new one: a call whose
// answer was lost, asked again under its number, gets what it booked (see
// lua/record.lua), and books nothing twice.
func (s *Store) Reserve(ctx context.Context, q Request, budget, notBefore time.Duration) (Booking, error) {
	b := Booking{Costs: q.Costs, Estimated: q.Estimated}
	n := len(s.limits)
	call := q.Call
	if call == 0 {
		call = s.NewCall()
	}
	budgetArg := maxDelayArg // a caller without a deadline: boxed once
	if budget != MaxDelay {
		budgetArg = budget.Microseconds()
	}
	script, args, at := reserveScript, []any(nil), 4 // at: the budget's place among args
	if s.oneBucket {
		announce := q.Pool != nil || s.announcer.due(q.Key) // a pool's bookings announce each time
		args = withoutTrailingZeros([]any{s.limitArgs[1], s.limitArgs[2], q.Costs[0], budgetArg,
			notBefore.Microseconds(), int64(q.Estimated), flag(announce), flag(q.Again)}, 4)
	}
	k, id := s.bookedKeys(q, call)
	keys := k.names
	if !s.oneBucket {
		script, args, at = quotaScript, append(make([]any, 0, 5+4*n), budgetArg, notBefore.Microseconds(), id), 1
		for i := range n {
			args = append(args, s.limitArgs[3*i], s.span(i), s.limitArgs[3*i+2], q.Costs[i])
		}
		args = append(args, int64(q.Estimated), flag(q.Again))
	}
	size, least := 5+2*n, 5+2*n // the reply's, and the least of it
	if s.oneBucket {
		size, least = size+2, 4 // the other limit (see lua/limits.lua); a plain booking's last five are left off
	}
	switch {
	case q.Take.Cap != nil:
		script, keys, args = s.withTake(script, keys, args, q.Key, q.Take, size)
		k.names = keys
	case q.Pool != nil:
		script, args = s.withPick(script, args, len(q.Pool), q.First, at, 5+2*n)
		size, least = size+1, least+1
	}
	var cmd *redis.Cmd
	if q.Probe {
		cmd = s.calls.RunLong(ctx, s.lateTake(ctx, q), script, k, args...)
	} else {
		cmd = s.calls.RunKeys(ctx, script, k, args...)
	}
	var reply [8 + 2*MaxLimits]int64
	got, err := shortInt64Reply(cmd, reply[:size], least)
	if err == nil && q.Take.Cap != nil && reply[0] == -1 {
		return Booking{SlotBusy: true, Now: reply[2]}, nil
	}
	if err == nil && q.Pool != nil { // the pick follows the booking's reply, as short as it is
		b.Pick = int(reply[got-1]) - 1
		reply[got-1] = 0
	}
	if err == nil && (reply[0] < 0 || reply[0] > 1 || reply[1] < 0 || q.Pool != nil && (b.Pick < 0 || b.Pick >= len(q.Pool))) {
		err = fmt.Errorf("replied %v, want [granted delay now finish... booked... listening recovered]", append([]int64(nil), reply[:size]...))
	}
	if err != nil {
		return Booking{}, s.fail(q.keyOf(keys, err), "reserve", keys, err)
	}
	b.Granted, b.Delay, b.Now = reply[0] == 1, Microseconds(reply[1]), reply[2]
	copy(b.Finishes[:], reply[3:3+n])
	copy(b.Booked[:], reply[3+n:3+2*n])
	b.Estimated &^= unsteered(b.Booked[:n])
	b.Listening, b.Recovered = reply[3+2*n] == 1, reply[4+2*n] == 1
	b.ID = id
	if s.oneBucket {
		b.Other.Interval, b.Other.Burst = reply[5+2*n], reply[6+2*n]
	}
	return b, nil
}

// withoutTrailingZeros is args without the zeros at its end past its first
// keep: a script reads an argument left off as 0, and Redis parses each
// one it is sent.
func withoutTrailingZeros(args []any, keep int) []any {
	for len(args) > keep && (args[len(args)-1] == 0 || args[len(args)-1] == int64(0)) {
		args = args[:len(args)-1]
	}
	return args
}

// BookedKey is the key b books for q: q's own, or the key of its pool
// that b picked.
func (q Request) BookedKey(b Booking) string {
	if q.Pool != nil {
		return q.Pool[b.Pick]
	}
	return q.Key
}

// keyOf is the key of q that err, a failure of the call whose keys are
// keys, concerns: q's own, or, for a pool, the key whose part of keys (an
// equal share each) holds the key a foreign-data error names.
func (q Request) keyOf(keys []string, err error) string {
	if q.Pool == nil {
		return q.Key
	}
	i, _, ok := keyErrorOf(err)
	if !ok || i < 1 || i > len(keys) {
		return q.Pool[0]
	}
	return q.Pool[(i-1)/(len(keys)/len(q.Pool))]
}

// bookedKeys returns the keys of q's booking (see bookingKeys) and its
// call's record, for each key of its pool in turn, and the booking's id.
// The keys of the key booked last are kept, boxed: a booking of the same
// key again boxes its record's name alone.
func (s *Store) bookedKeys(q Request, call uint64) (keys keyArgs, id string) {
	if q.Pool == nil {
		last := s.lastBooked.Load()
		if last == nil || last.key != q.Key {
			names := s.bookingKeys(q.Key)
			boxed := make([]any, len(names))
			for i, name := range names {
				boxed[i] = name
			}
			last = &bookedKey{key: q.Key, keys: keyArgs{names: names, boxed: boxed}}
			s.lastBooked.Store(last)
		}
		n := len(last.keys.names)
		names, id := s.recorded(last.keys.names[:n:n], q.Key, call)
		return keyArgs{names: names, boxed: last.keys.boxed}, id
	}
	for _, key := range q.Pool {
		var own []string
		own, id = s.recorded(s.bookingKeys(key), key, call)
		keys.names = append(keys.names, own...)
	}
	return keys, id
}

// bookedKey is the key a Store booked last, and its booking's keys.
type bookedKey struct {
	key  string
	keys keyArgs
}

// recorded returns keys, key's booking keys, with the record of call
// after them, and the booking's id.
func (s *Store) recorded(keys []string, key string, call uint64) ([]string, string) {
	base := keys[0][:len(s.prefix)+len(key)+len("{}")]
	record := s.recordKey(base, call)
	return append(keys, record), record[len(base)+len(CallSuffix):]
}

// withPick returns the booking script that books on one of a pool of n
// keys, from first on (see lua/pick.lua), with its arguments; at is the
// budget's place among args, recovered the place of its flag in the reply.
func (s *Store) withPick(script *script, args []any, n, first, at, recovered int) (*script, []any) {
	pick := reservePickScript
	if script == quotaScript {
		pick = quotaPickScript
	}
	return pick, append([]any{n, first + 1, at, recovered}, args...)
}

// lateTake is what undoes the late answer of a probe's booking that took
// q's slot: nobody holds it. A late booking stays: one request's cost.
func (s *Store) lateTake(ctx context.Context, q Request) func(*redis.Cmd) {
	if q.Take.Cap == nil {
		return nil
	}
	return func(*redis.Cmd) {
		s.Slots(context.WithoutCancel(ctx), q.Key, SlotCall{Op: SlotRelease, ID: q.Take.ID, Cap: q.Take.Cap})
	}
}

// withTake returns the booking script that takes slot with the booking,
// with its keys and arguments; size is the size of the booking's reply.
func (s *Store) withTake(script *script, keys []string, args []any, key string, slot SlotTake, size int) (*script, []string, []any) {
	take := reserveTakeScript
	if script == quotaScript {
		take = quotaTakeScript
	}
	keys = append(keys, s.tagged(key, slot.Cap.suffixes)...)
	return take, keys, append(args, size, slot.ID, slot.Cap.args[0], slot.Cap.args[1])
}

// NewCall returns the number of a new booking's call: with the member, its
// id, unique in the fleet.
func (s *Store) NewCall() uint64 { return s.requestIDs.Add(1) }

// recordKey returns the key of the record of call, beneath base (the key's
// prefix and hash tag): its text ends with the booking's id, member:call.
func (s *Store) recordKey(base string, call uint64) string {
	var digits [20]byte
	var text strings.Builder
	text.Grow(len(base) + len(CallSuffix) + len(s.member) + 1 + len(digits))
	text.WriteString(base)
	text.WriteString(CallSuffix)
	text.WriteString(s.member)
	text.WriteByte(':')
	text.Write(strconv.AppendUint(digits[:0], call, 10))
	return text.String()
}

// RefundResult says what the refund script did with a booking under one
// limit.
type RefundResult int64

const (
	RefundNothing RefundResult = iota // its time had passed, or the bucket was gone
	RefundTail                        // the tokens went back into the bucket, or the window
	RefundGap                         // kept as a gap until the bookings behind it go too
)

// Refund gives back booking b for key under every limit, and returns what
// became of it under each and the Redis TIME it used, in microseconds. Like
// every call, it has a deadline of its own, so it runs although ctx has
// usually ended.
func (s *Store) Refund(ctx context.Context, key string, b Booking) ([MaxLimits]RefundResult, int64, error) {
	var results [MaxLimits]RefundResult
	n := len(s.limits)
	args := append(make([]any, 0, 2+4*n), b.ID, b.Due())
	for i := range n {
		args = append(args, s.limitArgs[3*i], s.span(i), b.Costs[i], b.Finishes[i])
	}
	keys := s.Keys(key, true)
	var reply [1 + MaxLimits]int64
	err := int64Reply(s.calls.Run(ctx, refundScript, keys, args...), reply[:1+n])
	for i, res := range reply[1 : 1+n] {
		if err == nil && (res < int64(RefundNothing) || res > int64(RefundGap)) {
			err = fmt.Errorf("replied %v, want [now result...] with results 0, 1 or 2", append([]int64(nil), reply[:1+n]...))
		}
		results[i] = RefundResult(res)
	}
	if err != nil {
		return results, 0, s.fail(key, "refund", keys, err)
	}
	return results, reply[0], nil
}

// Settle settles booking b of key at the actual costs, and reports whether
// it did (false: it had been settled already) and the Redis TIME it used,
// in microseconds.
func (s *Store) Settle(ctx context.Context, key string, b Booking, actual LimitCosts) (bool, int64, error) {
	n := len(s.limits)
	args := append(make([]any, 0, 3+5*n), b.ID, b.Due())
	for i := range n {
		args = append(args, s.limitArgs[3*i], s.span(i), s.limitArgs[3*i+2], b.Costs[i], actual[i])
	}
	args = append(args, int64(b.Estimated))
	keys := append(s.Keys(key, true), s.prefix+"{"+key+"}"+SettledSuffix+b.ID)
	var reply [2]int64
	if err := int64Reply(s.calls.Run(ctx, settleScript, keys, args...), reply[:]); err != nil {
		return false, 0, s.fail(key, "settle", keys, err)
	}
	return reply[0] == 1, reply[1], nil
}

// Repay books debt, what this process granted of key alone, under each
// limit as far as lua/repay.lua lets it, and returns the units each took;
// lastTurn is how far from now the last turn Redis gave this process
// while it returned lies (0: none ahead), and shares the fleet's size:
// a bucket is spent through the fleet's shares' last turns.
func (s *Store) Repay(ctx context.Context, key string, debt LimitCosts, lastTurn time.Duration, shares int) (LimitCosts, error) {
	n := len(s.limits)
	args := make([]any, 0, 3+4*n)
	args = append(args, s.member+":repay:"+strconv.FormatUint(s.requestIDs.Add(1), 10))
	for i := range n {
		args = append(args, s.limitArgs[3*i], s.span(i), s.limitArgs[3*i+2], max(debt[i], 0))
	}
	args = append(args, max(lastTurn.Microseconds(), 0), max(shares, 1))
	keys := s.Keys(key, false)
	var reply [1 + MaxLimits]int64
	err := int64Reply(s.calls.Run(ctx, repayScript, keys, args...), reply[:1+n])
	var took LimitCosts
	for i, units := range reply[1 : 1+n] {
		if err == nil && (units < 0 || units > int64(max(debt[i], 0))) {
			err = fmt.Errorf("replied %v, want [now units...] with units from 0 to the debt", append([]int64(nil), reply[:1+n]...))
		}
		took[i] = int(units)
	}
	if err != nil {
		return LimitCosts{}, s.fail(key, "repay", keys, err)
	}
	return took, nil
}
