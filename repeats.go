package pace

import (
	"sync"
	"time"

	"github.com/fleetpace/pace/headers"
)

// repeatedHolds remembers, for each key, the last hold of a refusal that
// asks for longer waits while it repeats (headers.Hold.Repeats: GitHub's
// secondary limit): the next such refusal that comes before the last
// hold's end and as long again lasts twice as long, up to the most a
// limiter holds; a success forgets the key's. The zero value is ready.
type repeatedHolds struct {
	mu   sync.Mutex
	last map[string]repeatedHold
}

// repeatedHold is a key's last hold that repeats: its length, and when it
// ends.
type repeatedHold struct {
	length time.Duration
	end    time.Time
}

// maxRepeated bounds how many keys repeatedHolds keeps before it drops the
// ones whose holds can no longer be repeated.
const maxRepeated = 1024

// lengthen doubles each hold of w that repeats, for key, when the last one
// came so shortly before, up to max; w from a success forgets key's last.
func (r *repeatedHolds) lengthen(key string, w *headers.Word, max time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.Status >= 200 && w.Status < 300 {
		delete(r.last, key)
		return
	}
	for i, h := range w.Holds {
		if !h.Repeats {
			continue
		}
		if last, ok := r.last[key]; ok && w.At.Before(last.end.Add(last.length)) && h.For < 2*last.length {
			h.For = min(2*last.length, max)
			if h.For == max && h.Asked == 0 {
				h.Asked = 2 * last.length
			}
		}
		w.Holds[i] = h
		r.remember(key, repeatedHold{length: h.For, end: w.At.Add(h.For)}, w.At)
	}
}

// remember keeps hold as key's last, first dropping, when there are
// maxRepeated, the keys whose holds ended longer ago than they lasted.
func (r *repeatedHolds) remember(key string, hold repeatedHold, now time.Time) {
	if r.last == nil {
		r.last = make(map[string]repeatedHold)
	}
	if len(r.last) >= maxRepeated {
		for k, h := range r.last {
			if !now.Before(h.end.Add(h.length)) {
				delete(r.last, k)
			}
		}
	}
	if len(r.last) < maxRepeated {
		r.last[key] = hold
	}
}
