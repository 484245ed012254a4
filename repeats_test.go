package pace

import (
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
)

// TestRepeatedHoldsDouble: a hold that repeats doubles while the refusals
// come within the last hold's length of its end, up to the most, and is
// back at its own length after a success, after a pause as long as the
// last hold, and on another key.
func TestRepeatedHoldsDouble(t *testing.T) {
	var r repeatedHolds
	start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	refusal := func(at time.Duration, key string) time.Duration {
		w := headers.Word{Status: 403, At: start.Add(at), Holds: []headers.Hold{{For: time.Minute, Repeats: true}, {For: 5 * time.Second}}}
		r.lengthen(key, &w, start.Add(at-time.Millisecond), 10*time.Minute)
		if w.Holds[1].For != 5*time.Second {
			t.Errorf("a hold that does not repeat was lengthened to %v", w.Holds[1].For)
		}
		return w.Holds[0].For
	}
	success := func(at time.Duration, key string) {
		w := headers.Word{Status: 200, At: start.Add(at)}
		r.lengthen(key, &w, start.Add(at-time.Millisecond), 10*time.Minute)
	}
	for _, step := range []struct {
		at   time.Duration
		key  string
		ok   bool
		want time.Duration
	}{
		{0, "a", false, time.Minute},
		{time.Second, "a", false, 2 * time.Minute},                 // during the hold
		{3*time.Minute + time.Second, "a", false, 4 * time.Minute}, // within 2 min of its end
		{8 * time.Minute, "a", false, 8 * time.Minute},
		{9 * time.Minute, "a", false, 10 * time.Minute}, // the most
		{9 * time.Minute, "b", false, time.Minute},      // another key
		{10 * time.Minute, "a", true, 0},
		{10*time.Minute + time.Second, "a", false, time.Minute}, // after a success
		{13 * time.Minute, "a", false, time.Minute},             // after a pause as long as the hold
	} {
		if step.ok {
			success(step.at, step.key)
			continue
		}
		if got := refusal(step.at, step.key); got != step.want {
			t.Errorf("a refusal of %s at %v: held %v, want %v", step.key, step.at, got, step.want)
		}
	}
}

// TestRepeatedHoldsOnceAnEvent: eight requests in flight together, all
// refused with GitHub's secondary limit (a minute that repeats), hold the
// key once: the first's minute, which the others neither double nor
// extend (before, each doubled it: an hour); one refused after its end is
// of the event too, and holds nothing more. A request sent after the hold
// began, refused, is a repeat: it doubles.
func TestRepeatedHoldsOnceAnEvent(t *testing.T) {
	var r repeatedHolds
	start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	refused := func(sent, at time.Duration) []headers.Hold {
		w := headers.Word{Status: 403, At: start.Add(at), Holds: []headers.Hold{{For: time.Minute, Repeats: true}}}
		r.lengthen("api", &w, start.Add(sent), time.Hour)
		return w.Holds
	}
	for i := range 8 {
		at := time.Duration(i) * 10 * time.Millisecond
		holds := refused(-time.Millisecond, at)
		if len(holds) != 1 || holds[0].For != time.Minute-at {
			t.Fatalf("response %d of 8 in flight, at %v: holds %v, want the first's minute, to its end (%v)", i+1, at, holds, time.Minute-at)
		}
	}
	if holds := refused(-time.Millisecond, time.Minute+time.Second); len(holds) != 0 {
		t.Errorf("a response of the event after its hold ended: holds %v, want none", holds)
	}
	if holds := refused(time.Second, 2*time.Second); len(holds) != 1 || holds[0].For != 2*time.Minute {
		t.Errorf("a request sent during the hold, refused: holds %v, want one of 2 minutes (a repeat)", holds)
	}
}

// TestRepeatedHoldsBounded: however many keys are refused, the memory
// keeps at most maxRepeated, and drops those whose holds are over first.
func TestRepeatedHoldsBounded(t *testing.T) {
	var r repeatedHolds
	start := time.Now()
	for i := range 3 * maxRepeated {
		w := headers.Word{Status: 403, At: start.Add(time.Duration(i) * time.Second), Holds: []headers.Hold{{For: time.Minute, Repeats: true}}}
		r.lengthen(string(rune('a'+i%26))+time.Duration(i).String(), &w, w.At, time.Hour)
	}
	if n := len(r.last); n > maxRepeated || n < 100 {
		t.Errorf("%d keys kept, want from 100 to %d", n, maxRepeated)
	}
}
