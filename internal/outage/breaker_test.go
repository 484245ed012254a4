package outage

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestBreaker: which failures confirm an outage. Each row plays waves of
// calls that fail at once, each wave's calls begun after the last wave
// failed, with the call timeout at each wave, and checks the wave whose
// failure confirms the outage first (0 for none).
func TestBreaker(t *testing.T) {
	const ms = time.Millisecond
	type wave struct {
		calls    int
		took     time.Duration // from the wave's start to its failures
		timeout  time.Duration // the call timeout when they failed
		expired  bool
		failures int  // of each call's request, in a row (it included)
		ceiling  bool // the calls were given the longest timeout
	}
	for name, tc := range map[string]struct {
		waves   []wave
		answer  int // an answer comes before this wave (0 for none)
		confirm int
	}{
		"one error says little; two of calls begun after it confirm": {
			waves:   []wave{{1, ms, 50 * ms, false, 1, false}, {2, ms, 50 * ms, false, 2, false}},
			confirm: 2,
		},
		"an error of a call begun after the first, half a timeout later, confirms": {
			waves:   []wave{{1, ms, 50 * ms, false, 1, false}, {1, 30 * ms, 50 * ms, false, 2, false}},
			confirm: 2,
		},
		"an answer between two errors ends the row": {
			waves:  []wave{{1, ms, 50 * ms, false, 1, false}, {1, 30 * ms, 50 * ms, false, 1, false}},
			answer: 2,
		},
		"expiries, each under a timeout twice the last, confirm at a request's fourth only": {
			waves:   []wave{{4, 62 * ms, 100 * ms, true, 1, false}, {4, 125 * ms, 200 * ms, true, 2, false}, {4, 250 * ms, 400 * ms, true, 3, false}, {4, 500 * ms, 800 * ms, true, 4, false}},
			confirm: 4,
		},
		"a round trip that jumped: three waves expire (new connections), the fourth is answered": {
			waves: []wave{{4, 62 * ms, 100 * ms, true, 1, false}, {4, 125 * ms, 200 * ms, true, 2, false}, {4, 250 * ms, 400 * ms, true, 3, false}},
		},
		"an expiry under the ceiling's timeout (a limiter Redis never answered, or one backed off all the way) confirms": {
			waves:   []wave{{2, 1250 * ms, time.Second, true, 1, true}},
			confirm: 1,
		},
		"expiries of calls given less, under a timeout backed off to the ceiling since, do not": {
			waves: []wave{{4, 62 * ms, 100 * ms, true, 1, false}, {4, 800 * ms, time.Second, true, 2, false}},
		},
		"an error after expiries confirms at a request's third": {
			waves:   []wave{{4, 62 * ms, 100 * ms, true, 1, false}, {4, 125 * ms, 200 * ms, true, 2, false}, {1, ms, 200 * ms, false, 3, false}},
			confirm: 3,
		},
	} {
		t.Run(name, func(t *testing.T) {
			var answers atomic.Uint64
			b := breaker{answers: &answers}
			now := time.Unix(1_700_000_000, 0)
			confirmed := 0
			for i, w := range tc.waves {
				if tc.answer == i+1 {
					answers.Add(1)
				}
				began := now
				now = now.Add(w.took)
				for range w.calls {
					if b.confirms(now, began, w.timeout, w.failures, w.expired, w.ceiling) && confirmed == 0 {
						confirmed = i + 1
					}
				}
			}
			if confirmed != tc.confirm {
				t.Errorf("confirmed at wave %d, want %d", confirmed, tc.confirm)
			}
		})
	}
}
