package fleetsim

import "time"

// faults are the case's faults on Redis, each over a span of the run.
type faults struct {
	kind        string
	from, until time.Time
}

// newFaults places c's fault from a third of the run on, for a sixth of it
// (a stall or a kill for at most 2 s, as an operator's restart takes); a
// paused process, for pauseLength.
func newFaults(c Case, start time.Time) *faults {
	f := &faults{kind: c.Faults}
	if f.kind != "none" {
		f.from = start.Add(c.Duration / 3)
		f.until = f.from.Add(min(c.Duration/6, 2*time.Second))
	}
	if f.kind == "pause" {
		f.until = f.from.Add(pauseLength)
	}
	return f
}

// pauseLength is how long a paused process is away: as long as a process
// starved of CPU, or in a long garbage collection, on a loaded machine.
const pauseLength = 300 * time.Millisecond

// paused is how long process proc, paused at now, stays away (0 when it
// is not).
func (f *faults) paused(now time.Time, proc int) time.Duration {
	return max(f.pausedUntil(now, proc).Sub(now), 0)
}

// pausedUntil is when process proc, paused at now, goes on: only the first
// process pauses.
func (f *faults) pausedUntil(now time.Time, proc int) time.Time {
	if proc == 0 && f.during(now, "pause") {
		return f.until
	}
	return time.Time{}
}

func (f *faults) during(now time.Time, kind string) bool {
	return f.kind == kind && !now.Before(f.from) && now.Before(f.until)
}

// down reports whether a killed Redis refuses connections at now.
func (f *faults) down(now time.Time) bool { return f.during(now, "kill") }

// frozenUntil is when a frozen Redis answers again, if it is frozen at now.
func (f *faults) frozenUntil(now time.Time) time.Time {
	if f.during(now, "stall") {
		return f.until
	}
	return time.Time{}
}

// slowLinkDelay is what a slow link adds to each trip.
const slowLinkDelay = 40 * time.Millisecond

// extra is what a slow link adds to a trip at now.
func (f *faults) extra(now time.Time) time.Duration {
	if f.during(now, "slowlink") {
		return slowLinkDelay
	}
	return 0
}

// bunching is how much a pause can bunch arrivals beyond what the links
// do: it holds a process's granted requests and lets them go at once.
func (f *faults) bunching() time.Duration {
	if f.kind == "pause" {
		return pauseLength
	}
	return 0
}

// loseReply reports whether a reply at now is lost, with its connection:
// one in five, drawn from the trip it took, while the fault lasts.
func (f *faults) loseReply(now time.Time, draw uint64) bool {
	return f.during(now, "lostreply") && draw%5 == 0
}
