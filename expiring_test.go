package pace

import (
	"strconv"
	"testing"
	"time"
)

// TestExpiringMapSweepsRarely: 20,000 holds on distinct keys, all alive,
// sweep the map at each doubling only (before, every hold swept the whole
// map: see BenchmarkHoldsOnManyKeys); expired entries are
// swept, so the map holds at most twice the keys alive at the last sweep;
// a value is read back until then.
func TestExpiringMapSweepsRarely(t *testing.T) {
	var h heldKeys
	now := time.Unix(1_700_000_000, 0)
	sweeps, last := 0, 0
	for i := range 20000 {
		h.add("key"+strconv.Itoa(i), int64(i), time.Hour, now)
		if at := h.m.times.sweepAt; at != last {
			sweeps, last = sweeps+1, at
		}
	}
	if sweeps > 10 || h.m.times.len() != 20000 {
		t.Errorf("20,000 holds alive: %d sweeps, %d keys; want at most 10 (one at each doubling), all kept", sweeps, h.m.times.len())
	}
	if !h.before("key19999", 19998) || h.before("key19999", 19999) {
		t.Error("the last hold does not read back")
	}

	var m expiringMap[int]
	for i := range 1000 { // expire after a second
		m.put("old"+strconv.Itoa(i), i, now.Add(time.Second), now)
	}
	later := now.Add(2 * time.Second)
	for i := range 1000 {
		m.put("new"+strconv.Itoa(i), i, later.Add(time.Hour), later)
	}
	alive := 0
	m.each(later, func(string, int) { alive++ })
	if m.len() > 2*1000+minSweep || alive != 1000 {
		t.Errorf("1,000 expired keys and 1,000 alive: the map holds %d, %d alive; want at most %d, 1,000", m.len(), alive, 2*1000+minSweep)
	}
}
