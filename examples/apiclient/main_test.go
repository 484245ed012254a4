package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestCall: 12 items at 10 a second with a burst of 5, against an API that
// answers the 8th request 429 with Retry-After: 1: every item is created,
// and the whole takes the pacing and the one-second hold, not more; after
// the hold the items go at the rate, not in a burst: a refusal says the
// fleet went too fast, and the hold ends softly.
func TestCall(t *testing.T) {
	var out bytes.Buffer
	start := time.Now()
	if err := call(&out, "", "", "36000/h burst 5", 12); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("%v\n%s", took, out.String())
	if created := strings.Count(out.String(), ": 201 "); created != 12 {
		t.Errorf("%d of 12 items created", created)
	}
	// 5 at once, 3 more at 10/s (the third the 429'd attempt, at 0.3 s), a
	// hold of 1 s, and the 5 left at 10/s from its end.
	if took < 1650*time.Millisecond || took > 2050*time.Millisecond {
		t.Errorf("took %v, want about 1.7 s: the pacing, one hold, then the rate, evenly", took)
	}
}
