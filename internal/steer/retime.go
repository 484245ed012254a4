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
// changed (lua/sync.lua, which takes the bookings out of the schedule
// itself); the refused script "KEY\nrate AT" when a refusal cut the key's
// rate deep enough (lua/refused.lua: the callers give their bookings back,
// and book anew at the new rate), and "KEY\nrate AT AFTER" when a smaller
// cut did so to the bookings due after AFTER only, beyond what a wake keeps
// (see Kept), followed by "KEY\nrate AT" for the processes of a version
// that reads no AFTER, which a process that read it takes for the same cut.
// AT and AFTER are by Redis's clock, in microseconds. Each limiter notes
// when each key was retimed, and wakes its sleepers, which book anew if
// theirs was.
//
// Retimes are the retimes one limiter heard of. The zero Retimes is ready.
type Retimes struct {
	mu   sync.Mutex
	wake chan struct{}         // closed at the next retime
	keys expiring.Latest       // retimes of learned limits
	cuts expiring.Map[rateCut] // the latest cut of each key's rate
	told expiring.Latest       // bookings whose success this process told Redis of (see News)
}

// A rateCut of a key's rate voids the bookings made before at and due
// after after (0: all of them).
type rateCut struct{ at, after int64 }

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

// Add notes that key was retimed at at (its rate cut, when cut, for the
// bookings due after after: 0 for all), and wakes the sleepers.
func (r *Retimes) Add(key string, at, after int64, cut bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	forget := now.Add(time.Minute)
	if !cut {
		r.keys.Note(key, at, forget, now)
	} else if old, ok := r.cuts.Get(key); !ok || at > old.at {
		r.cuts.Put(key, rateCut{at, after}, forget, now)
	}
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// After returns ErrRecut when key's rate was cut after a booking decided
// at booked, due at due (Redis's clock, in microseconds), and the cut
// voided it; ErrRetimed when key was otherwise retimed after it; and nil
// when it was not.
func (r *Retimes) After(key string, booked, due int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.cuts.Get(key); ok && c.at > booked && due > c.after {
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
	c, known := r.cuts.Get(key)
	if known && booked < c.at {
		return false
	}
	if told, ok := r.told.Get(key); ok && (!known || told >= c.at) && booked < told+tellAgain.Microseconds() {
		return false
	}
	r.told.Note(key, booked, now.Add(time.Minute), now)
	return true
}

// tellAgain is how long after a success it told of a process tells Redis
// of another, while the key's rate listens, if it heard of no cut since.
const tellAgain = time.Second

// ParseMessage reads what the sync and refused scripts publish on a
// retime: the key, a newline, "retime" or "rate" (cut says which), its
// time, and, for a cut, the time after which the bookings it voids are due
// (0 when it is not given: all), in microseconds of Redis's clock.
func ParseMessage(payload string) (key string, at, after int64, cut, ok bool) {
	key, rest, ok := strings.Cut(payload, "\n")
	times, found := strings.CutPrefix(rest, "retime ")
	if !found {
		times, cut = strings.CutPrefix(rest, "rate ")
	}
	atText, afterText, partial := strings.Cut(times, " ")
	at, err := strconv.ParseInt(atText, 10, 64)
	if partial && err == nil {
		after, err = strconv.ParseInt(afterText, 10, 64)
	}
	return key, at, after, cut, ok && (found || cut) && err == nil && (!partial || cut)
}
