package steer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/expiring"
)

// A retime voids the bookings made before it: their callers, asleep in any
// process, wake and book anew, at the new pace. The sync script publishes
// "KEY\nretime AT" on the hold channel when the interval a key learned
// changed (lua/sync.lua, which takes the bookings out of the
// schedule itself), and the refused script "KEY\nrate AT" when a refusal
// cut the key's rate (lua/refused.lua: the callers give
// their bookings back); AT is by Redis's clock, in microseconds. Each
// limiter notes when each key was retimed, and wakes its sleepers, which
// book anew if theirs was.
//
// Retimes are the retimes one limiter heard of. The zero Retimes is ready.
type Retimes struct {
	mu   sync.Mutex
	wake chan struct{}   // closed at the next retime
	keys expiring.Latest // retimes of learned limits
	cuts expiring.Latest // retimes of cut rates
	told expiring.Latest // bookings whose success this process told Redis of (see News)
}

var (
	// ErrRetimed ends the sleep of a caller whose booking a retime voided:
	// the key's interval changed (and the sync script took the booking out
	// of the schedule), or, ErrRecut, its rate was cut (and the caller
	// gives the booking back).
	ErrRetimed = errors.New("pace: the key's pace changed")
	// ErrRecut is the ErrRetimed of a cut of the key's rate.
	ErrRecut = fmt.Errorf("%w: its rate was cut", ErrRetimed)
)

// Wake returns a channel that is closed at the next retime of any key.
func (r *Retimes) Wake() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return r.wake
}

// Add notes that key was retimed at at (its rate cut, when cut), and wakes
// the sleepers.
func (r *Retimes) Add(key string, at int64, cut bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	heard := &r.keys
	if cut {
		heard = &r.cuts
	}
	heard.Note(key, at, now.Add(time.Minute), now)
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// After returns ErrRecut when key's rate was cut after a booking decided
// at booked (Redis's clock, in microseconds), ErrRetimed when key was
// otherwise retimed after it, and nil when it was not.
func (r *Retimes) After(key string, booked int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if recut, ok := r.cuts.Get(key); ok && recut > booked {
		return ErrRecut
	}
	if learned, ok := r.keys.Get(key); ok && learned > booked {
		return ErrRetimed
	}
	return nil
}

// News reports whether the success of a request booked at booked, while
// key's rate listened for one (see Rate.Listening), is news to Redis:
// unless the refused script would ignore it (a booking before the latest
// cut this process heard of), or this process has told it of a success
// since that cut already, of a request booked less than tellAgain before.
// Each request a cut woke books anew while the rate listens: without this,
// each of them would tell. A cut too small to wake the sleepers is told to
// no process: a request booked tellAgain after the last success told,
// while the rate listens, says there was one. A success told is noted at
// once, so that the others of its cut stay silent while it is told.
func (r *Retimes) News(key string, booked int64, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cut, known := r.cuts.Get(key)
	if known && booked < cut {
		return false
	}
	if told, ok := r.told.Get(key); ok && (!known || told >= cut) && booked < told+tellAgain.Microseconds() {
		return false
	}
	r.told.Note(key, booked, now.Add(time.Minute), now)
	return true
}

// tellAgain is how long after a success it told of a process tells Redis
// of another, while the key's rate listens, if it heard of no cut since.
const tellAgain = time.Second

// ParseMessage reads what the sync and refused scripts publish on a
// retime: the key, a newline, "retime" or "rate" (cut says which) and its
// time, in microseconds of Redis's clock.
func ParseMessage(payload string) (key string, at int64, cut, ok bool) {
	key, rest, ok := strings.Cut(payload, "\n")
	atText, found := strings.CutPrefix(rest, "retime ")
	if !found {
		atText, cut = strings.CutPrefix(rest, "rate ")
	}
	at, err := strconv.ParseInt(atText, 10, 64)
	return key, at, cut, ok && (found || cut) && err == nil
}
