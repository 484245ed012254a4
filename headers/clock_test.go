package headers

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// upstreamAt is a response of an upstream whose clock runs offset ahead of
// ours, answered at our t: its Date (its second, rounded down) and a
// GitHub reading of a window that resets at its second reset, rounded up.
func upstreamAt(t time.Time, offset time.Duration, reset time.Time) *http.Response {
	theirs := t.Add(offset)
	return response(200, "Date", theirs.UTC().Format(http.TimeFormat),
		"X-RateLimit-Remaining", "10", "X-RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(reset.UnixNano())/1e9)), 10))
}

// TestClockLearnsTheOffset: against an upstream whose clock runs an hour
// and 0.3 s ahead, a first response's reset is taken against its Date, a
// second coarse (Early 2 s); once responses either side of the turn of one
// of its seconds came, against ours moved by the offset: the reset within
// the round trip of the truth, Early a second and the time between them.
func TestClockLearnsTheOffset(t *testing.T) {
	offset := time.Hour + 300*time.Millisecond
	start := holdNow.Truncate(time.Second)
	reset := start.Add(offset + 10*time.Second) // the upstream's, 10 s from start
	var c Clock
	const rtt = 2 * time.Millisecond
	hear := func(at time.Time) Reading {
		w := c.Hear(upstreamAt(at.Add(rtt/2), offset, reset), at, at.Add(rtt), time.Hour)
		if len(w.Readings) != 1 {
			t.Fatalf("at %v: readings %+v, want one", at, w.Readings)
		}
		return w.Readings[0]
	}
	first := hear(start)
	if first.Early != 2*time.Second {
		t.Errorf("first reading: Early %v, want 2s: the Date's second, and the reset's", first.Early)
	}
	var last Reading
	for at := start.Add(100 * time.Millisecond); at.Before(start.Add(1500 * time.Millisecond)); at = at.Add(100 * time.Millisecond) {
		last = hear(at)
		truth := reset.Add(-offset).Sub(at.Add(rtt))
		if at.After(start.Add(800 * time.Millisecond)) { // the upstream's second turned at our start + 0.7 s
			if d := last.Reset - truth; d < 0 || d > time.Second+rtt {
				t.Errorf("at +%v: Reset %v, want %v, up to a second later (rounded up)", at.Sub(start), last.Reset, truth)
			}
			if last.Early > time.Second+100*time.Millisecond+rtt || last.Early < time.Second {
				t.Errorf("at +%v: Early %v, want a second and the time between two responses", at.Sub(start), last.Early)
			}
		}
	}
	if last.Rounded() {
		t.Errorf("reading %+v taken for a rounded reset, 8.8 s away", last)
	}
}

// TestClockAgrees: where the Dates allow the clocks to agree, a reset is
// taken against ours, as by ParseReadings, however many responses came.
func TestClockAgrees(t *testing.T) {
	var c Clock
	for i := range 30 {
		at := holdNow.Add(time.Duration(i) * 100 * time.Millisecond)
		resp := response(200, "Date", at.UTC().Format(http.TimeFormat), "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", epoch(60))
		got, want := c.Hear(resp, at, at.Add(time.Millisecond), time.Hour).Readings, ParseReadings(resp, at.Add(time.Millisecond))
		if len(got) != 1 || len(want) != 1 || got[0].Reset != want[0].Reset || got[0].Early != time.Second {
			t.Fatalf("response %d: readings %+v, want %+v, Early 1s", i, got, want)
		}
	}
}

// TestClockSteps: when the upstream's clock steps, the bounds the new
// Date gives contradict those learned: the clock starts anew, against the
// Date, never against an offset gone.
func TestClockSteps(t *testing.T) {
	var c Clock
	start := holdNow.Truncate(time.Second)
	for i := range 20 {
		at := start.Add(time.Duration(i) * 100 * time.Millisecond)
		c.Hear(upstreamAt(at, time.Hour+300*time.Millisecond, at), at, at.Add(time.Millisecond), time.Hour)
	}
	at := start.Add(2 * time.Second)
	stepped := 2*time.Hour + 300*time.Millisecond
	w := c.Hear(upstreamAt(at, stepped, at.Add(stepped+30*time.Second)), at, at.Add(time.Millisecond), time.Hour)
	if len(w.Readings) != 1 || w.Readings[0].Early != 2*time.Second || w.Readings[0].Reset < 29*time.Second || w.Readings[0].Reset > 31*time.Second {
		t.Fatalf("readings %+v after the step, want one 30 s away (within the Date's second), Early 2s", w.Readings)
	}
}

// TestClockConcurrent: one Clock heard from many goroutines (run with
// -race).
func TestClockConcurrent(t *testing.T) {
	var c Clock
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				at := holdNow.Add(time.Duration(g*50+i) * 10 * time.Millisecond)
				c.Hear(upstreamAt(at, time.Hour, at.Add(time.Hour+time.Minute)), at, at.Add(time.Millisecond), time.Hour)
			}
		})
	}
	wg.Wait()
}

// FuzzClockHear: whatever the Dates and times, a Clock never panics, and
// its readings are sound (see FuzzParseReadings), with an Early of one or
// two seconds at most.
func FuzzClockHear(f *testing.F) {
	f.Add("Mon, 02 Jan 2006 15:04:05 GMT", "Mon, 02 Jan 2006 15:04:06 GMT", epoch(30), int64(0), int64(2000))
	f.Add("garbage", "Sun, 06 Nov 1994 08:49:37 GMT", "1", int64(-5000), int64(-1))
	f.Fuzz(func(t *testing.T, date1, date2, reset string, sentUs, rttUs int64) {
		var c Clock
		sent := holdNow.Add(time.Duration(sentUs%1e12) * time.Microsecond)
		for _, date := range []string{date1, date2, date1} {
			resp := response(200, "Date", date, "X-RateLimit-Remaining", "3", "X-RateLimit-Reset", reset)
			for _, r := range c.Hear(resp, sent, sent.Add(time.Duration(rttUs%1e9)*time.Microsecond), time.Hour).Readings {
				if r.Remaining != 3 || r.Reset <= 0 || r.Reset > store.MaxDelay || r.Early < 0 || r.Early > 2*time.Second {
					t.Fatalf("unsound reading %+v", r)
				}
			}
		}
	})
}
