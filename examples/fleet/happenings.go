package main

import (
	"context"
	"sync"
	"time"

	"github.com/fleetpace/pace"
)

// happenings is what one process's limiter told its observer of the run:
// its outage, from its first fallback to its last recovery, the waits it
// decided without Redis meanwhile, the holds it heard and the cuts of its
// keys' rates.
type happenings struct {
	OutageFrom time.Time `json:"outage_from"` // zero: Redis never away
	OutageTo   time.Time `json:"outage_to"`   // zero: not back
	Alone      int       `json:"alone"`
	Holds      int       `json:"holds"`
	Cuts       int       `json:"cuts"`
	LowestRate float64   `json:"lowest_rate"` // of the cuts, the lowest share of the limit's rate
}

// happeningsLog collects a process's happenings from its observer.
type happeningsLog struct {
	mu sync.Mutex
	h  happenings
}

func (l *happeningsLog) observe(_ context.Context, e pace.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := &l.h
	switch {
	case e.Kind == pace.EventFallback && h.OutageFrom.IsZero():
		h.OutageFrom = time.Now()
	case e.Kind == pace.EventRecover:
		h.OutageTo = time.Now()
	case e.Kind == pace.EventWait && e.Limiter != "redis":
		h.Alone++
	case e.Kind == pace.EventHold:
		h.Holds++
	case e.Kind == pace.EventRate && e.Rate < 1:
		h.Cuts++
		if h.LowestRate == 0 || e.Rate < h.LowestRate {
			h.LowestRate = e.Rate
		}
	}
}

// happened returns what l collected.
func (l *happeningsLog) happened() happenings {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h
}
