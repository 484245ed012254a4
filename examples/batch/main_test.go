package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestBatch: 30 items at 20 a second with a burst of 5 take the 25 paced
// ones' 1.25 s, with nothing failed, and the bar ends full.
func TestBatch(t *testing.T) {
	var out bytes.Buffer
	start := time.Now()
	if err := batch(&out, "", "20/s burst 5", 30, 4); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("%v: %q", took, out.String()[max(0, out.Len()-120):])
	if !strings.Contains(out.String(), "[##############################] 30/30") || !strings.Contains(out.String(), "0 failed") {
		t.Errorf("the bar did not end full, or items failed")
	}
	if took < 1200*time.Millisecond || took > 2*time.Second {
		t.Errorf("took %v, want about 1.25 s", took)
	}
}
