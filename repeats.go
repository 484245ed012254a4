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
// A refusal of a request sent before the last hold began is of the same
// event (requests in flight together, all refused): it holds the key no
// longer than the last hold does, and doubles nothing.
func (r *repeatedHolds) lengthen(key string, w *headers.Word, sent time.Time, max time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.Status >= 200 && w.Status < 300 {
		delete(r.last, key)
		return
	}
	holds := w.Holds[:0]
	for _, h := range w.Holds {
		last, ok := r.last[key]
		switch {
		case !h.Repeats:
		case ok && sent.Before(last.end.Add(-last.length)):
			if h.For = min(h.For, last.end.Sub(w.At)); h.For <= 0 {
				continue // the event's hold is over
			}
		case ok && w.At.Before(last.end.Add(last.length)) && h.For < 2*last.length:
			h.For = min(2*last.length, max)
			if h.For == max && h.Asked == 0 {
				h.Asked = 2 * last.length
			}
			fallthrough
		default:
			r.remember(key, repeatedHold{length: h.For, end: w.At.Add(h.For)}, w.At)
		}
		holds = append(holds, h)
	}
	w.Holds = holds
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
