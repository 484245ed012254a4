package pace

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// store runs pace's scripts on Redis for one quota: it names the keys,
// passes the arguments and reads the replies. It has no breaker and no
// observer. Every error it returns is either a *KeyError, about one key's
// data, or a failure of Redis, which the limiter's failover handles.
type store struct {
	calls      *caller
	prefix     string
	limits     []Limit
	suffixes   []string // each limit's key is prefix{key} and its suffix
	gapped     []string // each limit's suffix, then its gaps key's
	booked     []string // the suffixes of the keys a booking reads: its limits', its hold's, its rate's
	limitArgs  []any    // each limit's kind, interval or length, and burst or count, boxed once
	oneBucket  bool     // the quota is one bucket: reserve.lua, not quota.lua
	sliding    bool     // some limit is a sliding window, whose grants need ids
	member     string   // names this limiter's grants in sliding windows (newLimiterID)
	requestIDs atomic.Uint64
}

// A KeyError reports that what Redis holds for one key is not what pace
// wrote there (a value of another type or form, or a time further ahead than
// any pace books), or a fixed window booked more than 64 windows ahead. It
// concerns that key alone: Redis is not failing, and other keys go on.
// Deleting the Redis key, or letting it expire, heals it.
type KeyError struct {
	Key      string // the key, as the caller named it
	RedisKey string // the Redis key at fault
	Problem  string // what is wrong there
}

// Error names the key, the Redis key and the problem.
func (e *KeyError) Error() string {
	return fmt.Sprintf("pace: key %s: Redis key %s %s", quoteKey(e.Key), quoteKey(e.RedisKey), e.Problem)
}

// isOutage tells a failure of Redis, which the failure policy handles, from
// an error about one key's data, which the caller gets as it is: another
// Redis would not help.
func isOutage(err error) bool {
	if err == nil {
		return false
	}
	var keyErr *KeyError
	return !errors.As(err, &keyErr)
}

// keyErrorMarker starts the error a script raises about one key's data (see
// lua/common.lua), followed by the index of the key in KEYS.
const keyErrorMarker = "PACEKEY "

// Keys a user can name never contain reservedInNames after the hash tag;
// the keys pace keeps for itself (gaps, holds, heartbeats) always do. So no
// key or limit name can reach them.
const (
	reservedInNames = "{}#"
	gapsSuffix      = "#gaps"
	holdSuffix      = "#hold"
	settledSuffix   = "#settled:"
	rateSuffix      = "#rate"     // the key's rate after refusals
	slotsSuffix     = "#slots:"   // the holders of a cap's slots
	lineSuffix      = "#line:"    // its line of waiters
	waitersSuffix   = "#waiters:" // their leases
	deferredSuffix  = "#deferred" // the line of requests their class deferred
)

// horizon is the furthest ahead of Redis's clock that a time pace writes
// can lie: the longest wait it books and the longest refill. The scripts
// take anything further for foreign data.
const horizon = MaxDelay + maxRefill

var (
	//go:embed lua/common.lua
	commonSource string
	//go:embed lua/reserve.lua
	reserveSource string
	//go:embed lua/quota.lua
	quotaSource string
	//go:embed lua/booking.lua
	bookingSource string
	//go:embed lua/refund.lua
	refundSource string
	//go:embed lua/hold.lua
	holdSource string
	//go:embed lua/held.lua
	heldSource string
	//go:embed lua/settle.lua
	settleSource string
	//go:embed lua/sync.lua
	syncSource string
	//go:embed lua/slots.lua
	slotsSource string
	//go:embed lua/line.lua
	lineSource string
	//go:embed lua/rate.lua
	rateSource string
	//go:embed lua/refused.lua
	refusedSource string
	//go:embed lua/repay.lua
	repaySource string

	reserveScript = newScript(rateSource, reserveSource)
	quotaScript   = newScript(rateSource, quotaSource)
	refusedScript = newScript(rateSource, refusedSource)
	refundScript  = newScript(bookingSource, refundSource)
	holdScript    = newScript(holdSource)
	heldScript    = newScript(heldSource)
	settleScript  = newScript(bookingSource, settleSource)
	syncScript    = newScript(syncSource)
	slotsScript   = newScript(slotsSource)
	lineScript    = newScript(lineSource)
	repayScript   = newScript(repaySource)
)

// newScript is a script of parts, after the common prelude.
func newScript(parts ...string) *redis.Script {
	prelude := fmt.Sprintf("local horizon = %d\nlocal max_refill = %d\n", horizon.Microseconds(), maxRefill.Microseconds())
	return redis.NewScript(prelude + commonSource + strings.Join(parts, ""))
}

func newStore(calls *caller, prefix, member string, limits []Limit) *store {
	s := &store{calls: calls, prefix: prefix, limits: limits, member: member}
	for _, l := range limits {
		a, b := l.intervalMicros(), int64(l.burst)
		if l.kind != bucket {
			a = l.period.Microseconds()
		}
		s.limitArgs = append(s.limitArgs, int64(l.kind)+1, a, b)
		s.sliding = s.sliding || l.kind == slidingWindow
		suffix := ":" + cmp.Or(l.name, l.String())
		if len(limits) == 1 && l.kind == bucket && l.name == "" {
			suffix = "" // the layout of a single bucket: prefix{key}
		}
		s.suffixes = append(s.suffixes, suffix)
		s.gapped = append(s.gapped, suffix, suffix+gapsSuffix)
	}
	s.booked = append(slices.Clone(s.suffixes), holdSuffix, rateSuffix)
	s.oneBucket = len(limits) == 1 && limits[0].kind == bucket
	return s
}

// booking is what the reserve script decided.
type booking struct {
	granted   bool
	delay     time.Duration
	now       int64            // the Redis TIME of the decision, in microseconds
	finishes  [maxLimits]int64 // each bucket's schedule time after the booking (0 for windows)
	booked    [maxLimits]int64 // each steered bucket's count of units booked after the booking (else 0)
	listening bool             // the key's rate listens for a success (see refusals.go)
	recovered bool             // the key's rate was dropped, back at the configured one
	id        string           // the request's id: its grants in sliding windows, its settlement
	costs     limitCosts
	estimated limitSet // the limits whose costs are a reservation's estimates
}

// slot is when the request goes, by Redis's clock, in microseconds.
func (b booking) slot() int64 { return b.now + b.delay.Microseconds() }

// reserve runs the reserve script once: it books request q under every
// limit, for a caller who cannot go sooner than notBefore from now, unless
// the wait would exceed budget. A booking to be settled needs an id; one in
// a sliding window always has one.
func (s *store) reserve(ctx context.Context, q request, budget, notBefore time.Duration) (booking, error) {
	key, costs := q.key, q.costs
	b := booking{costs: costs, estimated: q.estimated}
	n := len(s.limits)
	keys := s.bookingKeys(key)
	if q.settled || s.sliding {
		b.id = s.member + ":" + strconv.FormatUint(s.requestIDs.Add(1), 10)
	}
	var reply [5 + 2*maxLimits]int64
	var cmd *redis.Cmd
	budgetArg := maxDelayArg // a caller without a deadline: boxed once
	if budget != MaxDelay {
		budgetArg = budget.Microseconds()
	}
	script, args := reserveScript, []any(nil)
	if s.oneBucket {
		args = []any{s.limitArgs[1], s.limitArgs[2], costs[0], budgetArg, notBefore.Microseconds(), int64(q.estimated)}
	} else {
		script, args = quotaScript, append(make([]any, 0, 4+4*n), budgetArg, notBefore.Microseconds(), b.id)
		for i := range n {
			args = append(args, s.limitArgs[3*i], s.limitArgs[3*i+1], s.limitArgs[3*i+2], costs[i])
		}
		args = append(args, int64(q.estimated))
	}
	if q.probe {
		cmd = s.calls.runLong(ctx, script, keys, args...)
	} else {
		cmd = s.calls.run(ctx, script, keys, args...)
	}
	err := int64Reply(cmd, reply[:5+2*n])
	if err == nil && (reply[0] < 0 || reply[0] > 1 || reply[1] < 0) {
		err = fmt.Errorf("replied %v, want [granted delay now finish... booked... listening recovered]", append([]int64(nil), reply[:5+2*n]...))
	}
	if err != nil {
		return booking{}, s.fail(key, "reserve", keys, err)
	}
	b.granted, b.delay, b.now = reply[0] == 1, microseconds(reply[1]), reply[2]
	copy(b.finishes[:], reply[3:3+n])
	copy(b.booked[:], reply[3+n:3+2*n])
	b.listening, b.recovered = reply[3+2*n] == 1, reply[4+2*n] == 1
	return b, nil
}

// refused tells key's rate what became of the request booked as b: the
// upstream refused it (served false: the rate may be cut, and the fleet
// told on channel), or served it. It returns the share of its configured
// rate the key goes at after a cut, in parts per million (0: nothing was
// cut), and the Redis TIME it used.
func (s *store) refused(ctx context.Context, key string, b booking, served bool, channel string) (share, now int64, err error) {
	op := "refused"
	if served {
		op = "served"
	}
	keys := []string{s.rateKey(key)}
	var reply [2]int64
	if err := int64Reply(s.calls.run(ctx, refusedScript, keys, op, b.now, channel, key), reply[:]); err != nil {
		return 0, 0, s.fail(key, "refused", keys, err)
	}
	return reply[1], reply[0], nil
}

// refundResult says what the refund script did with a booking under one
// limit.
type refundResult int64

const (
	refundNothing refundResult = iota // its time had passed, or the bucket was gone
	refundTail                        // the tokens went back into the bucket, or the window
	refundGap                         // kept as a gap until the bookings behind it go too
)

// refund gives back booking b for key under every limit, and returns what
// became of it under each and the Redis TIME it used, in microseconds. Like
// every call, it has a deadline of its own, so it runs although ctx has
// usually ended.
func (s *store) refund(ctx context.Context, key string, b booking) ([maxLimits]refundResult, int64, error) {
	var results [maxLimits]refundResult
	n := len(s.limits)
	args := append(make([]any, 0, 2+4*n), b.id, b.slot())
	for i := range n {
		args = append(args, s.limitArgs[3*i], s.limitArgs[3*i+1], b.costs[i], b.finishes[i])
	}
	keys := s.keys(key, true)
	var reply [1 + maxLimits]int64
	err := int64Reply(s.calls.run(ctx, refundScript, keys, args...), reply[:1+n])
	for i, res := range reply[1 : 1+n] {
		if err == nil && (res < int64(refundNothing) || res > int64(refundGap)) {
			err = fmt.Errorf("replied %v, want [now result...] with results 0, 1 or 2", append([]int64(nil), reply[:1+n]...))
		}
		results[i] = refundResult(res)
	}
	if err != nil {
		return results, 0, s.fail(key, "refund", keys, err)
	}
	return results, reply[0], nil
}

// settle settles booking b of key at the actual costs, and reports whether
// it did (false: it had been settled already) and the Redis TIME it used,
// in microseconds.
func (s *store) settle(ctx context.Context, key string, b booking, actual limitCosts) (bool, int64, error) {
	n := len(s.limits)
	args := append(make([]any, 0, 3+5*n), b.id, b.slot())
	for i := range n {
		args = append(args, s.limitArgs[3*i], s.limitArgs[3*i+1], s.limitArgs[3*i+2], b.costs[i], actual[i])
	}
	args = append(args, int64(b.estimated))
	keys := append(s.keys(key, true), s.prefix+"{"+key+"}"+settledSuffix+b.id)
	var reply [2]int64
	if err := int64Reply(s.calls.run(ctx, settleScript, keys, args...), reply[:]); err != nil {
		return false, 0, s.fail(key, "settle", keys, err)
	}
	return reply[0] == 1, reply[1], nil
}

// syncReply is what the sync script replied: for each steering, what
// became of it (0 stale, 1 applied, 2 applied and learned anew) and its
// bucket's count of units booked at its last reading (SYNCED, 0 when not
// steered); and the Redis TIME it used, in microseconds.
type syncReply struct {
	results, synced [maxLimits]int64
	now             int64
}

// sync steers key's buckets by what a response said (see lua/sync.lua),
// for the request booked as b. The upstream refused the request when
// refused (a 429). When the pace changes, it tells the fleet on channel,
// as of a hold.
func (s *store) sync(ctx context.Context, key string, b booking, steers []steering, refused bool, channel string) (syncReply, error) {
	keys := s.keys(key, false)
	syncKeys := make([]string, 0, len(steers)+1)
	args := append(make([]any, 0, 3+11*len(steers)), channel, key, flag(refused))
	for _, st := range steers {
		syncKeys = append(syncKeys, keys[st.limit])
		args = append(args, s.limitArgs[3*st.limit+1], s.limitArgs[3*st.limit+2], b.finishes[st.limit], b.booked[st.limit],
			b.slot(), flag(b.delay == 0), b.costs[st.limit], st.reading.Remaining, st.reset.Microseconds(), flag(st.reading.Refills), st.learned)
	}
	syncKeys = append(syncKeys, s.holdKey(key))
	var reply [1 + 2*maxLimits]int64
	n := len(steers)
	if err := int64Reply(s.calls.run(ctx, syncScript, syncKeys, args...), reply[:1+2*n]); err != nil {
		return syncReply{}, s.fail(key, "sync", syncKeys, err)
	}
	r := syncReply{now: reply[0]}
	copy(r.results[:], reply[1:1+n])
	copy(r.synced[:], reply[1+n:1+2*n])
	return r, nil
}

// flag is a script's argument for a truth: 1 or 0.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hold holds key for d from now, by Redis's clock, and tells the fleet on
// channel. It returns whether the hold outlasts the one in place, and when
// it ends, in microseconds of Redis's clock.
func (s *store) hold(ctx context.Context, key string, d time.Duration, channel string) (bool, int64, error) {
	keys := []string{s.holdKey(key)}
	var reply [2]int64
	if err := int64Reply(s.calls.run(ctx, holdScript, keys, d.Microseconds(), channel, key), reply[:]); err != nil {
		return false, 0, s.fail(key, "hold", keys, err)
	}
	return reply[0] == 1, reply[1] + d.Microseconds(), nil
}

// slotCall is one call of the slots script (lua/slots.lua): what to do
// (slotAcquire, slotWait, slotRenew or slotRelease) for which request id,
// under which cap (its name and size), with which lease, telling waiters on
// which channel.
type slotCall struct {
	op, id  string
	name    string
	limit   int
	lease   time.Duration
	channel string
}

// slots runs the slots script for key.
func (s *store) slots(ctx context.Context, key string, c slotCall) (slotsReply, error) {
	base := s.prefix + "{" + key + "}"
	keys := []string{base + slotsSuffix + c.name, base + lineSuffix + c.name, base + waitersSuffix + c.name}
	val, err := s.calls.run(ctx, slotsScript, keys, c.op, c.id, c.limit, c.lease.Microseconds(), c.channel, key).Result()
	if err != nil {
		return slotsReply{}, s.fail(key, "slots", keys, err)
	}
	items, ok := val.([]any)
	if !ok || len(items) != 4 {
		return slotsReply{}, fmt.Errorf("pace: key %s: the slots script replied %v, want 4 items", quoteKey(key), val)
	}
	var reply slotsReply
	now, _ := items[0].(string)
	reply.state, _ = items[1].(string)
	first, _ := items[2].(string)
	reply.expired, _ = items[3].(int64)
	reply.now, err = strconv.ParseInt(now, 10, 64)
	if reply.first, _ = strconv.ParseInt(first, 10, 64); err != nil || reply.state == "" {
		return slotsReply{}, fmt.Errorf("pace: key %s: the slots script replied %v, want a time, a state, a time and a count", quoteKey(key), val)
	}
	return reply, nil
}

// line returns the turn of a request of key that its class deferred, whose
// wait comes within its horizon after earliest, and whose cost takes turn
// to refill (see lua/line.lua).
func (s *store) line(ctx context.Context, key string, earliest, turn time.Duration) (time.Duration, error) {
	_, at, err := s.lineAt(ctx, key, earliest, turn)
	return at, err
}

// lineAt is line, and the TIME the script used.
func (s *store) lineAt(ctx context.Context, key string, earliest, turn time.Duration) (now int64, at time.Duration, err error) {
	keys := []string{s.prefix + "{" + key + "}" + deferredSuffix}
	var reply [2]int64
	if err := int64Reply(s.calls.run(ctx, lineScript, keys, max(earliest, 0).Microseconds(), turn.Microseconds()), reply[:]); err != nil {
		return 0, 0, s.fail(key, "line", keys, err)
	}
	return reply[0], microseconds(reply[1]), nil
}

// heldUntil returns when key's latest hold ends, in microseconds of Redis's
// clock, or 0.
func (s *store) heldUntil(ctx context.Context, key string) (int64, error) {
	keys := []string{s.holdKey(key)}
	end, err := s.calls.run(ctx, heldScript, keys).Int64()
	if err != nil {
		return 0, s.fail(key, "held", keys, err)
	}
	return end, nil
}

// fail turns the error of script's call for key into a *KeyError when the
// script raised one about keys, and otherwise names the key and script.
func (s *store) fail(key, script string, keys []string, err error) error {
	var redisErr redis.Error
	if errors.As(err, &redisErr) {
		if rest, ok := strings.CutPrefix(redisErr.Error(), keyErrorMarker); ok {
			index, problem, _ := strings.Cut(rest, " ")
			problem, _, _ = strings.Cut(problem, " script: ") // Redis names the script after the message
			keyErr := &KeyError{Key: key, Problem: problem}
			if i, convErr := strconv.Atoi(index); convErr == nil && i >= 1 && i <= len(keys) {
				keyErr.RedisKey = keys[i-1]
			}
			return keyErr
		}
	}
	return fmt.Errorf("pace: key %s: %s script: %w", quoteKey(key), script, err)
}

// maxDelayArg is MaxDelay as a script argument, boxed once.
var maxDelayArg any = MaxDelay.Microseconds()

// microseconds converts a script's microseconds to a Duration, saturated
// rather than wrapped should a value ever lie beyond 292 years.
func microseconds(us int64) time.Duration {
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

// keys are the Redis keys of key's limits, each followed by its gaps key when
// withGaps.
func (s *store) keys(key string, withGaps bool) []string {
	if withGaps {
		return s.tagged(key, s.gapped)
	}
	return s.tagged(key, s.suffixes)
}

// bookingKeys are the Redis keys a booking of key reads: its limits', then
// its hold's and its rate's.
func (s *store) bookingKeys(key string) []string { return s.tagged(key, s.booked) }

// tagged returns key's Redis key with each of suffixes, all under one hash
// tag (one Redis Cluster slot), with room for one key more (a hold's or a
// settlement's). Their text is one allocation: a booking's keys are made
// on every call.
func (s *store) tagged(key string, suffixes []string) []string {
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
func (s *store) rateKey(key string) string { return s.prefix + "{" + key + "}" + rateSuffix }

// holdKey is the Redis key that says when key's latest hold ends.
func (s *store) holdKey(key string) string { return s.prefix + "{" + key + "}" + holdSuffix }

// bucketKey is the Redis key of key's first limit.
func (s *store) bucketKey(key string) string { return s.keys(key, false)[0] }
