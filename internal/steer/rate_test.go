package steer

import (
	"testing"
)

// TestKeyRate: the controller of a key's rate after refusals, on a plain
// clock in microseconds. Each row plays a sequence of refusals and
// successes and checks the share of the configured rate at some times.
func TestKeyRate(t *testing.T) {
	const s = 1_000_000 // a second, in µs
	type check struct {
		at   int64 // µs after the first refusal
		want int64 // ppm, or (-1) within 1% of the next field
		near int64
	}
	for name, tc := range map[string]struct {
		play   func(k *Rate) // from t = 0, the first refusal
		checks []check
	}{
		"a first refusal cuts to 70%, climbs to 97% within 500 ms, probes above, and recovers": {
			play: func(k *Rate) { k.Refused(0, 0) },
			checks: []check{
				{0, 700_000, 0}, {250_000, -1, 932_000}, {500_000, 970_000, 0},
				{500_000 + s, -1, 989_000}, // +2% after a second of probe
				{500_000 + 1_160_000, -1, 999_800},
				{500_000 + 1_162_000, 1_000_000, 0}, // 970000 * (1 + (1.162/3.7)^3) >= 10^6
			},
		},
		"a refusal of a request booked before the cut changes nothing": {
			play:   func(k *Rate) { k.Refused(0, 0); k.Refused(1000, -5) },
			checks: []check{{1000, -1, 700_000}, {500_000, 970_000, 0}},
		},
		"with no success heard, refusals deepen the cut and keep the edge (the upstream's memory)": {
			play: func(k *Rate) {
				k.Refused(0, 0)
				k.Refused(10_000, 5_000) // booked after the cut, at 71.6% 10 ms into the climb: cut to 70% of it
				k.Refused(20_000, 15_000)
			},
			// 0.7 * (970000 - 468881 * (490/500)^3) = 370083: the second cut, 10 ms into its climb, cut again
			checks: []check{{20_000, 370_083, 0}, {520_000, 970_000, 0}},
		},
		"after a success, a refusal lowers the edge to the rate it was booked at, by 30% at most": {
			play: func(k *Rate) {
				k.Refused(0, 0)
				k.Served(100_000)
				k.Refused(300_000, 250_000) // booked 250 ms into the climb, at 970000 - 270000/8: the edge
			},
			checks: []check{{800_000, 908_163, 0}}, // 3% below 936250
		},
		"after a success, a refusal booked far below the edge lowers it by 30% only": {
			play: func(k *Rate) {
				k.Refused(0, 0)
				k.Served(1)
				k.Refused(1_000, 1)
			},
			checks: []check{{501_000, -1, 679_000}}, // 3% below 70%
		},
		"the rate never falls below 1% of the configured one": {
			play: func(k *Rate) {
				for i := range int64(40) {
					k.Refused(i, i)
				}
			},
			checks: []check{{39, Floor, 0}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var k Rate
			tc.play(&k)
			for _, c := range tc.checks {
				got := k.Share(c.at)
				if c.want >= 0 && got != c.want || c.want < 0 && (got < c.near*99/100 || got > c.near*101/100) {
					t.Errorf("share at %d µs: %d ppm, want %d (or within 1%% of %d)", c.at, got, c.want, c.near)
				}
			}
		})
	}
}

// TestKeyRateBucket: under a rate of 50% of 1000/s (1 ms a unit), with a
// burst of 50 ms, requests go 2 ms apart: during the climb without a
// burst, the first an interval after the cut; after it, after a burst of
// 25. No burst of the configured limit's (1 s) lets more through.
func TestKeyRateBucket(t *testing.T) {
	for name, tc := range map[string]struct {
		now          int64 // µs after the cut, at a share of 50%
		first, burst int64 // when the first goes, after now; how many go then
	}{
		"during the climb": {0, 2000, 1},
		"after it":         {Climb, 0, 25},
	} {
		t.Run(name, func(t *testing.T) {
			k := Rate{on: true, edge: Full, bottom: 500_000}
			if tc.now > 0 { // the climb done: its top at 50%
				k.edge = 515_465
			}
			if got := k.Share(tc.now); got < 499_990 || got > 500_010 {
				t.Fatalf("share %d, want 500000", got)
			}
			for i := range int64(40) {
				due := k.Allow(tc.now, tc.now, 1000, 1_000_000)
				k.Book(tc.now, due, 1000)
				want := tc.now + tc.first + max(i-tc.burst+1, 0)*2000
				if d := due - want; d < -2 || d > 2 { // the share's rounding
					t.Fatalf("request %d went at +%d µs, want +%d", i, due-tc.now, want-tc.now)
				}
			}
			if got := k.Allow(tc.now, tc.now, 0, 1_000_000); got != tc.now {
				t.Errorf("a request that costs nothing waits until +%d µs, want none", got-tc.now)
			}
		})
	}
}
