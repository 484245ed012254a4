package expiring

import (
	"strconv"
	"testing"
	"time"
)

// TestSweepsRarely: 20,000 times on distinct keys, all alive, sweep the map
// at each doubling only (before, every hold swept the whole map: see
// BenchmarkHoldsOnManyKeys); expired entries are swept, so the map holds
// at most twice the keys alive at the last sweep; a value is read back
// until then.
func TestSweepsRarely(t *testing.T) {
	var l Latest
	now := time.Unix(1_700_000_000, 0)
	sweeps, last := 0, 0
	for i := range 20000 {
		l.Note("key"+strconv.Itoa(i), int64(i), now.Add(time.Hour), now)
		if at := l.times.sweepAt; at != last {
			sweeps, last = sweeps+1, at
		}
	}
	if sweeps > 10 || l.Len() != 20000 {
		t.Errorf("20,000 keys alive: %d sweeps, %d keys; want at most 10 (one at each doubling), all kept", sweeps, l.Len())
	}
	if at, ok := l.Get("key19999"); !ok || at != 19999 {
		t.Errorf("the last key reads back %d, %v; want 19999", at, ok)
	}
	l.Note("key19999", 5, now.Add(time.Hour), now)
	if at, _ := l.Get("key19999"); at != 19999 {
		t.Errorf("an earlier time replaced the latest: %d", at)
	}

	var m Map[int]
	for i := range 1000 { // expire after a second
		m.Put("old"+strconv.Itoa(i), i, now.Add(time.Second), now)
	}
	later := now.Add(2 * time.Second)
	for i := range 1000 {
		m.Put("new"+strconv.Itoa(i), i, later.Add(time.Hour), later)
	}
	alive := 0
	m.Each(later, func(string, int) { alive++ })
	if m.Len() > 2*1000+minSweep || alive != 1000 {
		t.Errorf("1,000 expired keys and 1,000 alive: the map holds %d, %d alive; want at most %d, 1,000", m.Len(), alive, 2*1000+minSweep)
	}
}
