package pace

import (
	"strconv"
	"time"
)

// An Observer sees what a limiter decides, so that a program can log, count
// or trace it; pace itself never logs. It is called synchronously on the
// caller's goroutine, possibly from many goroutines at once: it must be safe
// for concurrent use and quick.
type Observer func(Event)

// An Event is one thing a limiter did.
type Event struct {
	Kind    EventKind
	Limiter string        // "redis" or "local": which limiter decided
	Key     string        // the key the event is about
	Cost    int           // the units asked for
	Delay   time.Duration // the wait booked, refused or cut short
	Err     error         // why a wait was refused or ended early; nil for EventWait
}

// An EventKind says what an Event reports.
type EventKind uint8

const (
	// EventWait: cost units were booked; the caller waits Delay, then goes.
	EventWait EventKind = iota + 1
	// EventRefuse: nothing was booked, since a wait of Delay would pass the
	// caller's deadline or the maximum wait; Err is a *DeadlineError.
	EventRefuse
	// EventCancel: the caller's context ended during its wait; its booking
	// was given back (Err says if that failed).
	EventCancel
)

// String returns the kind's name: "wait", "refuse" or "cancel".
func (k EventKind) String() string {
	switch k {
	case EventWait:
		return "wait"
	case EventRefuse:
		return "refuse"
	case EventCancel:
		return "cancel"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

func (o Observer) emit(e Event) {
	if o != nil {
		o(e)
	}
}
