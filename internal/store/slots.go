package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotCap is a limiter's cap of requests in flight, as its slots' calls
// name it: its size (Limit), the keys of its holders, line and waiters,
// and its lease and channel. Create it with NewSlotCap.
type SlotCap struct {
	Limit    int
	suffixes []string // of its keys: its holders', line's and waiters'
	args     [3]any   // the limit, the lease in microseconds and the channel that tells waiters their slot, boxed once
}

// NewSlotCap returns the cap named name of limit slots, each with lease,
// whose waiters are told on channel.
func NewSlotCap(name string, limit int, lease time.Duration, channel string) *SlotCap {
	return &SlotCap{Limit: limit,
		suffixes: []string{SlotsSuffix + name, LineSuffix + name, WaitersSuffix + name},
		args:     [3]any{limit, lease.Microseconds(), channel}}
}

// SlotCall is one call of the slots script (lua/slots.lua): what to do
// (SlotAcquire, SlotWait, SlotRenew or SlotRelease) for which request id,
// under which cap.
type SlotCall struct {
	Op, ID string
	Cap    *SlotCap
	Probe  bool // the failover's probe: the call goes on after its timeout (see Caller.RunLong), and a late answer's slot is released
}

// Slots runs the slots script for key. A release with nobody in line,
// the common one, needs no script (see release).
func (s *Store) Slots(ctx context.Context, key string, c SlotCall) (SlotsReply, error) {
	if c.Op == SlotRelease && !c.Probe {
		if done, err := s.release(ctx, key, c.Cap, c.ID); done || err != nil {
			return SlotsReply{State: SlotNone}, err
		}
	}
	keys := s.tagged(key, c.Cap.suffixes)
	args := []any{c.Op, c.ID, c.Cap.args[0], c.Cap.args[1], c.Cap.args[2], key}
	var cmd *redis.Cmd
	if c.Probe {
		cmd = s.calls.RunLong(ctx, func(*redis.Cmd) { s.leave(ctx, keys, args) }, slotsScript, keyArgs{names: keys}, args...)
	} else {
		cmd = s.calls.Run(ctx, slotsScript, keys, args...)
	}
	val, err := cmd.Result()
	if err != nil {
		return SlotsReply{}, s.fail(key, "slots", keys, err)
	}
	items, ok := val.([]any)
	if !ok || len(items) != 4 {
		return SlotsReply{}, fmt.Errorf("pace: key %s: the slots script replied %v, want 4 items", QuoteKey(key), val)
	}
	var reply SlotsReply
	now, _ := items[0].(string)
	reply.State, _ = items[1].(string)
	first, _ := items[2].(string)
	reply.Expired, _ = items[3].(int64)
	reply.Now, err = strconv.ParseInt(now, 10, 64)
	if reply.First, _ = strconv.ParseInt(first, 10, 64); err != nil || reply.State == "" {
		return SlotsReply{}, fmt.Errorf("pace: key %s: the slots script replied %v, want a time, a state, a time and a count", QuoteKey(key), val)
	}
	return reply, nil
}

// release frees the slot id of key's cap c, when nobody is in line, the
// common case, in a script of two commands (lua/release.lua), and reports
// whether it did. Otherwise (someone in
// line, or a key of another type than pace writes) the slots script does
// the release, hands the slot on, or names the key.
func (s *Store) release(ctx context.Context, key string, c *SlotCap, id string) (bool, error) {
	keys := s.tagged(key, c.suffixes[:2])
	left, err := s.calls.Run(ctx, releaseScript, keys, id).Int64()
	if err != nil {
		return false, s.fail(key, "release", keys, err)
	}
	return left == 1, nil
}

// leave releases the slot, or the place in line, that a call of args,
// answered after its caller had gone, took for the caller's id: a slot
// nobody holds would be lost to the fleet until its lease lapsed.
func (s *Store) leave(ctx context.Context, keys []string, args []any) {
	release := slices.Clone(args)
	release[0] = SlotRelease
	s.calls.Run(context.WithoutCancel(ctx), slotsScript, keys, release...)
}

// What the slots script does with an id (see lua/slots.lua), and what it
// says of one.
const (
	SlotAcquire = "acquire"
	SlotWait    = "wait"
	SlotRenew   = "renew"
	SlotRelease = "release"

	SlotHeld    = "held"
	SlotWaiting = "waiting"
	SlotNone    = "none"
)

// SlotsReply is the slots script's answer, times in microseconds of Redis's
// clock.
type SlotsReply struct {
	Now     int64
	State   string // SlotHeld, SlotWaiting or SlotNone
	First   int64  // when the first holder's lease ends; 0 for none
	Expired int64  // leases of holders that lapsed
}

// NextCheck is how long a waiter sleeps, unless told sooner: until the
// first holder's lease may lapse, or a third of its own lease.
func (s SlotsReply) NextCheck(lease time.Duration) time.Duration {
	d := lease / 3
	if s.First > 0 {
		d = min(d, time.Duration(s.First-s.Now+1000)*time.Microsecond)
	}
	return max(d, time.Millisecond)
}
