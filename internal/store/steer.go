package store

import (
	"context"
	"time"
)

// Refused tells key's rate what became of the request booked as b: the
// upstream refused it (served false: the rate may be cut, and the fleet
// told on channel), or served it. before, for a refusal that brought a
// hold of the key, is when the hold before that one ended (0 for none): a
// refusal after a hold weighs more (see internal/steer). It returns the
// share of its configured rate the key goes at after a cut, in parts per
// million (0: nothing was cut), and the Redis TIME it used.
func (s *Store) Refused(ctx context.Context, key string, b Booking, served bool, before int64, channel string) (share, now int64, err error) {
	op := "refused"
	if served {
		op = "served"
	}
	keys := []string{s.rateKey(key), s.HoldKey(key)}
	args := []any{op, b.Now, channel, key, BucketBurst(s.limits), before}
	if !served {
		// A wake trims the key's buckets' queues (see lua/refused.lua).
		gapped := s.Keys(key, true)
		for i, l := range s.limits {
			if l.Kind == Bucket {
				keys = append(keys, gapped[2*i], gapped[2*i+1])
				args = append(args, s.limitArgs[3*i+1], s.limitArgs[3*i+2])
			}
		}
	}
	var reply [2]int64
	if err := int64Reply(s.calls.Run(ctx, refusedScript, keys, args...), reply[:]); err != nil {
		return 0, 0, s.fail(key, "refused", keys, err)
	}
	return reply[1], reply[0], nil
}

// A Steer is what one reading of the upstream's counters tells one limit
// of a quota (see lua/sync.lua).
type Steer struct {
	Limit     int           // the limit's index
	Remaining int64         // the units the upstream has left
	Reset     time.Duration // from now until the window resets, or the quota is full
	Refills   bool          // the units come back a few at a time, as a bucket's do
	Rounded   bool          // a reset a second away or less, said in whole seconds (headers.Reading.Rounded)
	Early     time.Duration // how much sooner the reset may come (headers.Reading.Early)
	Learned   int64         // the interval learned, in microseconds; 0 when not learning
	Size      int64         // the quota's size, as the reading states its limit; 0 when it does not
}

// SyncReply is what the sync script replied: for each steering, what
// became of it (0 stale, 1 applied, 2 applied and learned anew) and its
// bucket's count of units booked at its last reading (SYNCED, 0 when not
// steered); and the Redis TIME it used, in microseconds.
type SyncReply struct {
	Results, Synced [MaxLimits]int64
	Now             int64
}

// Sync steers key's buckets by what a response said (see lua/sync.lua),
// for the request booked as b. The upstream refused the request when
// refused (a 429). When the pace changes, it tells the fleet on channel,
// as of a hold.
func (s *Store) Sync(ctx context.Context, key string, b Booking, steers []Steer, refused bool, channel string) (SyncReply, error) {
	keys := s.Keys(key, false)
	syncKeys := make([]string, 0, len(steers)+1)
	args := append(make([]any, 0, 3+13*len(steers)), channel, key, flag(refused))
	for _, st := range steers {
		syncKeys = append(syncKeys, keys[st.Limit])
		args = append(args, s.limitArgs[3*st.Limit+1], s.limitArgs[3*st.Limit+2], b.Finishes[st.Limit], b.Booked[st.Limit],
			b.Due(), flag(b.Delay == 0), b.Costs[st.Limit], st.Remaining, st.Reset.Microseconds(), st.Early.Microseconds(), st.kind(), st.Learned, st.Size)
	}
	syncKeys = append(syncKeys, s.HoldKey(key))
	var reply [1 + 2*MaxLimits]int64
	n := len(steers)
	if err := int64Reply(s.calls.Run(ctx, syncScript, syncKeys, args...), reply[:1+2*n]); err != nil {
		return SyncReply{}, s.fail(key, "sync", syncKeys, err)
	}
	r := SyncReply{Now: reply[0]}
	copy(r.Results[:], reply[1:1+n])
	copy(r.Synced[:], reply[1+n:1+2*n])
	return r, nil
}

// flag is a script's argument for a truth: 1 or 0.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BucketBurst is the smallest burst of the buckets among limits, 0 for
// none: the refusals of requests booked before a key's rate opened that
// weigh nothing, in Redis and in Local (a window's count is no burst of
// its rate: a sliding window's refusals at the start are evidence, as
// HAProxy's memory of them is).
func BucketBurst(limits []Limit) int {
	least := 0
	for _, l := range limits {
		if l.Kind == Bucket && (least == 0 || l.Count < least) {
			least = l.Count
		}
	}
	return least
}

// kind is how sync.lua takes st's units left: 0 a window's, 1 a quota's
// that refills, 2 a level alone (Rounded: the quota may come back at any
// time before the reset, so the reading tells no rate of others), 3 a
// level alone of a quota that refills (a bucket's, Rounded and Refills),
// which counts its refills since the request too.
func (st Steer) kind() int {
	switch {
	case st.Rounded && st.Refills:
		return 3
	case st.Rounded:
		return 2
	}
	return flag(st.Refills)
}
