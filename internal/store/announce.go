package store

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// announceEvery is how often a process's bookings of a key of one bucket
// announce its limit (see lua/limits.lua), which then stands for 2 s and
// is written again once less than 1 s is left: at least twice in that
// second, so that a limit booked without a pause never lapses. The
// bookings between read nothing of the limits, unless they differ.
const announceEvery = 500 * time.Millisecond

// announceSlots is how many keys an announcer tells apart at once.
const announceSlots = 1024

// An announcer says which bookings announce the store's limit: a key's
// first in announceEvery in this process, as far as a table of
// announceSlots keys can tell. A key whose slot another takes announces at
// its next booking. It keeps no more memory however many keys there are.
type announcer struct {
	seed  maphash.Seed
	start time.Time
	// slots hold, for the key that last took each, the top 24 bits of its
	// hash and, in the low 40, when it last announced: milliseconds since
	// start.
	slots *[announceSlots]atomic.Uint64
}

func newAnnouncer() announcer {
	return announcer{seed: maphash.MakeSeed(), start: time.Now(), slots: new([announceSlots]atomic.Uint64)}
}

// due reports whether a booking of key now announces the limit, and if
// so notes it. Two bookings at once may both announce: a call more.
func (a announcer) due(key string) bool {
	const low = 40
	h := maphash.String(a.seed, key)
	slot := &a.slots[h%announceSlots]
	tag, now := h>>low<<low, uint64(time.Since(a.start).Milliseconds())&(1<<low-1)
	if v := slot.Load(); v>>low<<low == tag && now-v&(1<<low-1) < uint64(announceEvery.Milliseconds()) {
		return false
	}
	slot.Store(tag | now)
	return true
}
