package outage

import (
	"hash/maphash"
	"sync"
	"time"
)

// scheduleTable keeps, for each key, how far this process knows the shared
// schedule of the key to reach (by this process's clock): the last time
// Redis gave it, or the end of a hold; and how far ahead of the reply that
// time lay, the schedule's lead. An outage's local pacing of the key begins
// after the schedule: after its known end, and, since the rest of the fleet
// kept booking after this process last heard, no sooner than the lead after
// the outage began. Entries whose end has passed are swept once a second,
// so the table holds only keys booked ahead.
type scheduleTable struct {
	seed   maphash.Seed
	once   sync.Once
	shards [slotShards]slotShard
}

// slotShards spreads keys over independent locks, as Local's shards do.
const slotShards = 32

type slotShard struct {
	mu        sync.Mutex
	slots     map[string]schedule
	nextSweep time.Time
}

// schedule is what a process knows of a key's shared schedule.
type schedule struct {
	end  time.Time     // it reaches at least this far
	lead time.Duration // how far ahead of now it reached when last heard of
}

// shard is the shard that keeps key.
func (t *scheduleTable) shard(key string) *slotShard {
	t.once.Do(func() { t.seed = maphash.MakeSeed() })
	return &t.shards[maphash.String(t.seed, key)%slotShards]
}

// note records that key's schedule reaches to end, which lay lead ahead
// when heard of (0 for a hold, whose end nobody extends); an end that is not
// ahead of now is no news.
func (t *scheduleTable) note(key string, end time.Time, lead time.Duration, now time.Time) {
	if !end.After(now) {
		return
	}
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !now.Before(s.nextSweep) {
		for k, sc := range s.slots {
			if !sc.end.After(now) {
				delete(s.slots, k)
			}
		}
		s.nextSweep = now.Add(time.Second)
	}
	if s.slots == nil {
		s.slots = make(map[string]schedule)
	}
	sc := s.slots[key]
	sc.end = latest(sc.end, end)
	if lead > 0 {
		sc.lead = lead
	}
	s.slots[key] = sc
}

// ahead returns how far past now key's schedule reaches, as far as this
// process knows (0: not past now).
func (t *scheduleTable) ahead(key string, now time.Time) time.Duration {
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.slots[key].end.Sub(now), 0)
}

// floors returns, for an outage that begins at since, when each key booked
// ahead may begin its local pacing: after its schedule's known end, and no
// sooner than its lead after since.
func (t *scheduleTable) floors(since time.Time) map[string]time.Time {
	floors := make(map[string]time.Time)
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, sc := range s.slots {
			if sc.end.After(since) {
				floors[k] = latest(sc.end, since.Add(sc.lead))
			}
		}
		s.mu.Unlock()
	}
	return floors
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
