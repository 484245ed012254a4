package steer

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
)

// quotaReading is a reading of a quota that says it refills, heard after
// from the first: left units, full again in reset.
type quotaReading struct {
	after time.Duration
	left  int64
	reset time.Duration
}

// TestWindowsTells: readings 100 ms apart of a window of a second (full
// at its reset, 1 s from the start, whatever is spent), of a token bucket
// of 100/s burst 100 (full once its missing units come back, 10 ms each)
// spent as fast as it refills, or faster, or idle, and of HAProxy's
// sliding window, whose units come back before its period ends. Two
// readings in a row that count as a window's tell a window (w; else -);
// two that count as a bucket's turn it back.
func TestWindowsTells(t *testing.T) {
	ms := time.Millisecond
	for name, tc := range map[string]struct {
		readings []quotaReading
		told     string // after each reading
	}{
		"a window, spent": {
			[]quotaReading{{0, 90, 1000 * ms}, {100 * ms, 80, 900 * ms}, {200 * ms, 70, 800 * ms}, {300 * ms, 60, 700 * ms}}, "--ww",
		},
		"a window, idle": {
			[]quotaReading{{0, 90, 1000 * ms}, {100 * ms, 90, 900 * ms}, {200 * ms, 90, 800 * ms}}, "--w",
		},
		"a window's reset comes back full, and tells nothing": {
			[]quotaReading{{0, 90, 200 * ms}, {100 * ms, 80, 100 * ms}, {200 * ms, 100, 1000 * ms}, {300 * ms, 90, 900 * ms}}, "---w",
		},
		"a bucket spent as fast as it refills": {
			[]quotaReading{{0, 50, 500 * ms}, {100 * ms, 50, 500 * ms}, {200 * ms, 50, 500 * ms}, {300 * ms, 50, 500 * ms}}, "----",
		},
		"a bucket spent faster": {
			[]quotaReading{{0, 50, 500 * ms}, {100 * ms, 40, 600 * ms}, {200 * ms, 30, 700 * ms}}, "---",
		},
		"a bucket idle tells nothing": {
			[]quotaReading{{0, 50, 500 * ms}, {100 * ms, 60, 400 * ms}, {200 * ms, 70, 300 * ms}}, "---",
		},
		"a bucket after a window's readings is a bucket after two": {
			[]quotaReading{{0, 90, 1000 * ms}, {100 * ms, 80, 900 * ms}, {200 * ms, 70, 800 * ms}, {300 * ms, 70, 800 * ms}, {400 * ms, 70, 800 * ms}}, "--ww-",
		},
		"a window's reading heard 100 ms late turns nothing": {
			[]quotaReading{{0, 90, 1000 * ms}, {100 * ms, 80, 900 * ms}, {200 * ms, 70, 800 * ms}, {400 * ms, 60, 700 * ms}, {500 * ms, 50, 500 * ms}}, "--www",
		},
		"readings closer than windowGap compare with the one before them": {
			[]quotaReading{{0, 90, 1000 * ms}, {20 * ms, 89, 980 * ms}, {60 * ms, 85, 940 * ms}, {90 * ms, 84, 910 * ms}, {130 * ms, 80, 870 * ms}}, "----w",
		},
		"an older reading come late tells nothing": {
			[]quotaReading{{100 * ms, 80, 900 * ms}, {0, 90, 1000 * ms}, {200 * ms, 70, 800 * ms}, {300 * ms, 60, 700 * ms}}, "---w",
		},
		"HAProxy's sliding window, spent at its rate": { // its count at the period's end is still the last period's
			[]quotaReading{{0, 50, 300 * ms}, {100 * ms, 50, 200 * ms}, {200 * ms, 50, 100 * ms}, {300 * ms, 52, 1000 * ms}, {400 * ms, 51, 900 * ms}}, "--www",
		},
	} {
		t.Run(name, func(t *testing.T) {
			var w Windows
			start := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
			for i, r := range tc.readings {
				if got, _ := w.tell("k", "requests", r.left, r.reset, start.Add(r.after)); got != (tc.told[i] == 'w') {
					t.Errorf("reading %d (%+v): a window %v, want %c", i, r, got, tc.told[i])
				}
			}
		})
	}
}

// TestWindowsRead: once readings of a quota tell a window, Read says it
// does not refill, and that its reset may be now (a level alone) for a
// window of a second or less, or in the second after it was told (a
// window of 3 s is a level alone at 200 ms, a window again at 1.3 s); the
// readings of a bucket, of a quota not told yet (another key's), that say
// they do not refill, or whose reset is rounded, are as they were; and the
// readings given are never changed.
func TestWindowsRead(t *testing.T) {
	var w Windows
	start := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	reading := func(name string, left int64, reset time.Duration) headers.Reading {
		return headers.Reading{Name: name, Remaining: left, Reset: reset, Refills: true}
	}
	read := func(at time.Duration, given ...headers.Reading) []headers.Reading {
		before := fmt.Sprint(given)
		got := w.Read("k", given, start.Add(at))
		if after := fmt.Sprint(given); after != before {
			t.Fatalf("Read changed the readings given: %s, was %s", after, before)
		}
		return got
	}
	var got []headers.Reading
	for i := range int64(3) {
		at := time.Duration(i) * 100 * time.Millisecond
		got = read(at, reading("requests", 90-10*i, time.Second-at), reading("tokens", 9000-1000*i, 3*time.Second-at),
			reading("bucket", 50, 500*time.Millisecond), headers.Reading{Name: "window", Remaining: 5, Reset: 2 * time.Second},
			headers.Reading{Name: "rounded", Remaining: 90 - 10*i, Reset: time.Second, Early: time.Second, Refills: true})
	}
	want := []headers.Reading{
		{Name: "requests", Remaining: 70, Reset: 800 * time.Millisecond, Early: 800 * time.Millisecond},
		{Name: "tokens", Remaining: 7000, Reset: 2800 * time.Millisecond, Early: 2800 * time.Millisecond},
		reading("bucket", 50, 500*time.Millisecond),
		{Name: "window", Remaining: 5, Reset: 2 * time.Second},
		{Name: "rounded", Remaining: 70, Reset: time.Second, Early: time.Second, Refills: true},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after three readings 100 ms apart:\n got %+v\nwant %+v", got, want)
	}
	later := read(1300*time.Millisecond, reading("tokens", 5000, 1700*time.Millisecond))
	if want := (headers.Reading{Name: "tokens", Remaining: 5000, Reset: 1700 * time.Millisecond}); later[0] != want {
		t.Errorf("the window of 3 s at 1.3 s: %+v, want %+v", later[0], want)
	}
	if other := w.Read("other", []headers.Reading{reading("requests", 70, 800*time.Millisecond)}, start); !other[0].Refills || other[0].Early != 0 {
		t.Errorf("another key's first reading of the quota: %+v; want it as it was", other[0])
	}
}
