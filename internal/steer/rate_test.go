package steer

import (
	"testing"
)

// TestKeyRate: the controller of a key's rate after refusals, on a plain
// clock in microseconds. Each row plays bookings (of 1 ms at the
// configured rate, each due when booked), refusals and successes from
// t = 0, the first refusal, and checks the cuts, the wakes, and the share
// of the configured rate at some times.
func TestKeyRate(t *testing.T) {
	const s = 1_000_000 // a second, in µs
	type check struct {
		at          int64 // µs
		least, most int64 // ppm
	}
	exactly := func(at, share int64) check { return check{at, share, share} }
	for name, tc := range map[string]struct {
		play        func(k *Rate) (cuts, wakes int)
		cuts, wakes int
		checks      []check
		goneBy      int64 // when the rate is gone at the latest (0: not checked), and not a µs before
	}{
		"a lone refusal opens the rate, cuts nothing, wakes the sleepers to book evenly, and is gone when quiet": {
			play:  func(k *Rate) (int, int) { return tally(k.Refused(0, 0, 0, 0)) },
			wakes: 1, checks: []check{exactly(0, Full), exactly(s, Full)}, goneBy: quiet,
		},
		"a refusal after 150 requests gone cuts by 1/151, wakes no one, and the rate probes back": {
			play: func(k *Rate) (int, int) {
				c, w := tally(k.Refused(0, 0, 0, 0))
				book(k, 1, 150, 6_000)
				c2, w2 := tally(k.Refused(s, 990_000, 0, 0))
				return c + c2, w + w2
			},
			cuts: 1, wakes: 1, // the opening's
			checks: []check{exactly(s, Full-Full/151), exactly(s+Climb, Full-Full/151), {s + Climb + 2_700_000, Full, Full}},
			goneBy: s + quiet,
		},
		"refusals one request apart halve the rate and wake the sleepers; none heard to succeed, the rate climbs back to the edge": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 0, 0)
				book(k, 1, 1, 0)
				return tally(k.Refused(10_000, 1, 0, 0))
			},
			cuts: 1, wakes: 1, checks: []check{exactly(10_000, 500_000), exactly(10_000+Climb, Full)},
		},
		"a refusal that holds the key after the last one's hold ended weighs the burst the upstream refilled, and the key held since is probed slower": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 5, 0)
				k.Held(s) // its hold, until 1 s
				book(k, s, 30, 1000)
				k.Held(2 * s)                                     // the refusal's own hold, set first
				return tally(k.Refused(s+30_000, s+29_000, 5, s)) // 6 unpaid of 30 ms at 1 ms a request
			},
			cuts: 1, wakes: 1,
			checks: []check{exactly(s+30_000, 800_000), exactly(s+30_000+Climb+4_000_000, 812_500)},
		},
		"the same refusal without a hold weighs 1 of 31, and the key is probed as fast as before": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 5, 0)
				k.Held(s)
				book(k, s, 30, 1000)
				return tally(k.Refused(s+30_000, s+29_000, 5, 0))
			},
			cuts: 1, checks: []check{exactly(s+30_000, Full-Full/31)},
		},
		"a refusal of a request booked before the cut does not cut again: it is weighed with the next": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 0, 0)
				book(k, 1, 10, 1000)
				c, w := tally(k.Refused(20_000, 5, 0, 0))   // 1 of 11: to 909091
				c2, w2 := tally(k.Refused(21_000, 6, 0, 0)) // booked before the cut
				book(k, 30_001, 10, 1000)
				c3, w3 := tally(k.Refused(60_000, 30_005, 0, 0)) // 2 of 11
				return c + c2 + c3, w + w2 + w3
			},
			cuts: 2, wakes: 1, // the second cut, by 2/11 of 909091, wakes
			checks: []check{exactly(60_000, 909_091-909_091*181_818/Full), exactly(60_000+Climb, 909_091-909_091*181_818/Full)},
		},
		"as many refusals of requests booked before the rate opened as the burst (a start, a process that stalled) weigh nothing": {
			play: func(k *Rate) (int, int) {
				c, w := tally(k.Refused(100_000, 90_000, 40, 0))
				for i := range int64(39) {
					k.Refused(100_000+i*100, 95_000, 40, 0) // the rest of the burst
				}
				book(k, 100_001, 150, 1000)
				c2, w2 := tally(k.Refused(260_000, 200_000, 40, 0)) // 1 of the 150 gone since, and this one
				return c + c2, w + w2
			},
			cuts: 1, wakes: 1, // the opening's
			checks: []check{exactly(260_000, Full-Full/151)},
		},
		"more, and they weigh beyond it (a limit too high from the start); the opening is no cut, and they do not storm": {
			play: func(k *Rate) (int, int) {
				k.Refused(100_000, 90_000, 5, 0)
				for i := range int64(24) {
					k.Refused(100_000+i*100, 95_000, 5, 0) // 20 beyond the burst, and the opening's
				}
				book(k, 100_001, 20, 10_000)
				return tally(k.Refused(200_000, 150_000, 5, 0)) // 20 refused of the 10 gone since, and this one: half at most
			},
			cuts: 1, wakes: 1,
			checks: []check{exactly(200_000, Full/2)},
		},
		"a storm of refusals of requests booked before a small cut (HAProxy, over its limit, refuses them all) halves the rate, never below half the edge, wakes the sleepers, once, and the edge stays": {
			play: func(k *Rate) (int, int) {
				return refusedAfterASmallCut(k, 0, s+5000, s+10_000, s+15_000, s+20_000, s+25_000, s+30_000) // the second storms: 2 of the 0 gone since
			},
			cuts: 2, wakes: 1,
			checks: []check{exactly(s+10_000, 497_512), exactly(s+10_000+Climb, 995_025)},
		},
		"refusals of requests booked before the cut, fewer than three in four of those gone since, do not storm": {
			play: func(k *Rate) (int, int) {
				return refusedAfterASmallCut(k, 10, s+10_000, s+10_001, s+10_002, s+10_003) // 4 of the 10 gone since: 8 would storm
			},
			cuts: 1, checks: []check{exactly(s+10_000, 995_025)},
		},
		"a held key does not storm: its sleepers book anew after the hold": {
			play: func(k *Rate) (int, int) {
				k.Held(2 * s)
				return refusedAfterASmallCut(k, 0, s+5000, s+10_000, s+15_000, s+20_000, s+25_000, s+30_000)
			},
			cuts: 1, checks: []check{exactly(s+30_000, 995_025)},
		},
		"with no success heard, refusals of all (HAProxy's memory) cut again, and the edge stands": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 0, 0)
				book(k, 1, 1, 0)
				c, w := tally(k.Refused(10_000, 1, 0, 0)) // to 50%
				for range 9 {
					k.Refused(11_000, 5_000, 0, 0) // booked before the cut
				}
				c2, w2 := tally(k.Refused(20_000, 15_000, 0, 0)) // 10 refused, none gone
				return c + c2, w + w2
			},
			cuts: 2, wakes: 2, checks: []check{exactly(20_000, 264_702), exactly(20_000+Climb, Full)}, // half of 52.9%, 10 ms into the climb
		},
		"after a success, a refusal in the climb sets the edge halfway from where the climb began": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 0, 0)
				book(k, 1, 1, 0)
				k.Refused(10_000, 1, 0, 0)
				for range 9 {
					k.Refused(11_000, 5_000, 0, 0)
				}
				k.Refused(20_000, 15_000, 0, 0) // to 26.5%, the edge 100%
				k.Served(20_001)
				book(k, 20_001, 20, 2000)
				return tally(k.Refused(120_000, 60_000, 0, 0)) // booked at 42.7%: 1 of 21 refused, 40.7% found; halfway from 26.5%: 33.6%
			},
			cuts: 1, wakes: 1,
			checks: []check{{120_000 + Climb, 330_000, 340_000}},
		},
		"the rate never falls below 1% of the configured one": {
			play: func(k *Rate) (int, int) {
				k.Refused(0, 0, 0, 0)
				cuts := 0
				for i := int64(1); i <= 12; i++ {
					book(k, i*1000, 1, 0)
					c, _ := tally(k.Refused(i*1000+500, i*1000, 0, 0))
					cuts += c
				}
				return cuts, 0
			},
			cuts: 12, checks: []check{exactly(12_500, Floor)},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var k Rate
			cuts, wakes := tc.play(&k)
			if cuts != tc.cuts || wakes != tc.wakes {
				t.Errorf("%d cuts, %d wakes; want %d and %d", cuts, wakes, tc.cuts, tc.wakes)
			}
			for _, c := range tc.checks {
				if got := k.Share(c.at); got < c.least || got > c.most {
					t.Errorf("share at %d µs: %d ppm, want %d to %d", c.at, got, c.least, c.most)
				}
			}
			if tc.goneBy > 0 && (k.Recovered(tc.goneBy-1) || !k.Recovered(tc.goneBy)) {
				t.Errorf("the rate is not gone at %d µs, or gone a µs before", tc.goneBy)
			}
		})
	}
}

// book books n requests of 1 ms at the configured rate on k, from at on,
// gap apart, each due when booked.
func book(k *Rate, at, n, gap int64) {
	for i := range n {
		k.Book(at+i*gap, at+i*gap, 1000, false)
	}
}

// refusedAfterASmallCut opens k's rate, cuts it by 1/201 at 1 s with a
// refusal after 200 requests gone (to 995025, the edge there), books more,
// 1 ms apart from then, and at each time given refuses a request booked
// before that cut; it returns the cuts and wakes since the opening.
func refusedAfterASmallCut(k *Rate, more int64, at ...int64) (cuts, wakes int) {
	const s = 1_000_000
	k.Refused(0, 0, 0, 0)
	book(k, 1, 200, 5000)
	cuts, wakes = tally(k.Refused(s, 995_000, 0, 0))
	book(k, s, more, 1000)
	for i, t := range at {
		c, w := tally(k.Refused(t, 996_000+int64(i), 0, 0))
		cuts, wakes = cuts+c, wakes+w
	}
	return cuts, wakes
}

// tally counts one Refused's cut and wake.
func tally(cut, wake bool) (cuts, wakes int) {
	if cut {
		cuts = 1
	}
	if wake {
		wakes = 1
	}
	return cuts, wakes
}

// TestKeyRateBucket: under a rate of 50% of 1000/s (1 ms a unit), requests
// go 2 ms apart, without a burst: during the climb, the first an interval
// after the cut; after it, the first at once.
func TestKeyRateBucket(t *testing.T) {
	for name, tc := range map[string]struct {
		now          int64 // µs after the cut, at a share of 50%
		first, burst int64 // when the first goes, after now; how many go then
	}{
		"during the climb": {0, 2000, 1},
		"after it":         {Climb, 0, 1},
	} {
		t.Run(name, func(t *testing.T) {
			k := Rate{on: true, edge: Full, bottom: 500_000}
			if tc.now > 0 { // the climb done: at the edge, 50%
				k.edge = 500_000
			}
			if got := k.Share(tc.now); got < 499_990 || got > 500_010 {
				t.Fatalf("share %d, want 500000", got)
			}
			for i := range int64(40) {
				due := k.Allow(tc.now, tc.now, 1000)
				k.Book(tc.now, due, 1000, false)
				want := tc.now + tc.first + max(i-tc.burst+1, 0)*2000
				if d := due - want; d < -2 || d > 2 { // the share's rounding
					t.Fatalf("request %d went at +%d µs, want +%d", i, due-tc.now, want-tc.now)
				}
			}
			if got := k.Allow(tc.now, tc.now, 0); got != tc.now {
				t.Errorf("a request that costs nothing waits until +%d µs, want none", got-tc.now)
			}
		})
	}
}

// TestRequestBookedAnewCountsOnce: a request a hold or a retime displaced
// books anew, and the rate weighs a refusal by the requests gone, not by
// their bookings: ten requests booked twice weigh a refusal as ten (1/11),
// where twenty requests weigh it as twenty (1/21).
func TestRequestBookedAnewCountsOnce(t *testing.T) {
	bottom := func(again bool) int64 {
		var k Rate
		k.Refused(0, 0, 0, 0) // opens the rate
		book(&k, 1000, 10, 10_000)
		for i := range int64(10) {
			k.Book(200_000+i*10_000, 200_000+i*10_000, 1000, again)
		}
		if cut, _ := k.Refused(400_000, 390_000, 0, 0); !cut {
			t.Fatalf("again=%v: the refusal cut nothing", again)
		}
		return k.Bottom()
	}
	if got, want := bottom(true), int64(Full-Full/11); got != want {
		t.Errorf("ten requests, each booked anew: the refusal left %d, want %d (a weight of 1/11)", got, want)
	}
	if got, want := bottom(false), int64(Full-Full/21); got != want {
		t.Errorf("twenty requests: the refusal left %d, want %d (a weight of 1/21)", got, want)
	}
}
