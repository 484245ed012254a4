package store

import (
	"sync/atomic"
	"time"
)

// maxCallTimeout is the longest a Redis call may be given: beyond it, a
// Redis that answers is of no use to the requests that wait for it.
const maxCallTimeout = time.Second

// roundTrips measures this limiter's round trips to Redis and sets the
// timeout of its calls from them, much as TCP sets its retransmission
// timeout (RFC 6298): from the smoothed round trip and its mean deviation.
// A call may have to open a connection first, whose handshake (go-redis's
// HELLO, then its CLIENT SETINFO) takes two round trips more, so a call
// gets three smoothed round trips and four deviations, with the configured
// timeout (WithCallTimeout) as its floor and as the least margin above
// them, and maxCallTimeout as its ceiling. A Redis in another zone, or a
// machine so loaded that its calls take 40 ms, is then slow, not away.
// Until a first call answers, the timeout is the ceiling: a distant Redis
// is not taken for a lost one before it has been heard. A call that times
// out is no sample (as Karn's algorithm has it): it says nothing of the
// round trip. It is safe for concurrent use.
type roundTrips struct {
	floor time.Duration
	// measured packs the smoothed round trip (high 32 bits) and its mean
	// deviation (low 32 bits), in microseconds; zero until the first answer.
	measured atomic.Uint64
}

// timeout returns the timeout of a call that begins now.
func (r *roundTrips) timeout() time.Duration {
	ceiling := max(maxCallTimeout, r.floor)
	m := r.measured.Load()
	if m == 0 {
		return ceiling
	}
	srtt, rttvar := time.Duration(m>>32)*time.Microsecond, time.Duration(uint32(m))*time.Microsecond
	return min(3*srtt+max(r.floor, 4*rttvar), ceiling)
}

// answered takes the round trip of a call that Redis answered, with a
// reply or an error of its own.
func (r *roundTrips) answered(rtt time.Duration) {
	sample := uint64(min(max(rtt, time.Microsecond), maxCallTimeout) / time.Microsecond)
	for {
		old := r.measured.Load()
		next := sample<<32 | sample/2 // the first: its deviation half of it
		if old != 0 {
			srtt, rttvar := old>>32, uint64(uint32(old))
			dev := max(srtt, sample) - min(srtt, sample)
			rttvar = (3*rttvar + dev) / 4 // β = 1/4
			srtt = (7*srtt + sample) / 8  // α = 1/8
			next = max(srtt, 1)<<32 | rttvar
		}
		if r.measured.CompareAndSwap(old, next) {
			return
		}
	}
}
