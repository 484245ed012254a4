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
		r.lengthen(key, &w, 10*time.Minute)
		if w.Holds[1].For != 5*time.Second {
			t.Errorf("a hold that does not repeat was lengthened to %v", w.Holds[1].For)
		}
		return w.Holds[0].For
	}
	success := func(at time.Duration, key string) {
		w := headers.Word{Status: 200, At: start.Add(at)}
		r.lengthen(key, &w, 10*time.Minute)
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

// TestRepeatedHoldsBounded: however many keys are refused, the memory
// keeps at most maxRepeated, and drops those whose holds are over first.
func TestRepeatedHoldsBounded(t *testing.T) {
	var r repeatedHolds
	start := time.Now()
	for i := range 3 * maxRepeated {
		w := headers.Word{Status: 403, At: start.Add(time.Duration(i) * time.Second), Holds: []headers.Hold{{For: time.Minute, Repeats: true}}}
		r.lengthen(string(rune('a'+i%26))+time.Duration(i).String(), &w, time.Hour)
	}
	if n := len(r.last); n > maxRepeated || n < 100 {
		t.Errorf("%d keys kept, want from 100 to %d", n, maxRepeated)
	}
}
