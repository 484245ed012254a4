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
// round trip; but it doubles the timeout, up to the ceiling, as each
// expiry of TCP's timer does (RFC 6298, 5.5), so that a Redis whose round
// trips jump (a failover to another zone, a congested path) is waited for
// by the next call instead of taken for lost call after call. The first
// answer after sets the timeout from its round trip alone. The calls that
// expire together, under one timeout, double it once. It is safe for
// concurrent use.
type roundTrips struct {
	floor time.Duration
	// measured packs the smoothed round trip (high 32 bits) and its mean
	// deviation (low 32 bits), in microseconds; zero until the first answer.
	measured atomic.Uint64
	// backoff is how many times the timeout has doubled since the last
	// answer.
	backoff atomic.Uint32
}

// maxBackoff bounds the doublings: 2^10 times the least timeout is past
// any ceiling.
const maxBackoff = 10

// timeout returns the timeout of a call that begins now, and its backoff
// (see expired).
func (r *roundTrips) timeout() (time.Duration, uint32) {
	ceiling, backoff := max(maxCallTimeout, r.floor), r.backoff.Load()
	m := r.measured.Load()
	if m == 0 {
		return ceiling, backoff
	}
	srtt, rttvar := time.Duration(m>>32)*time.Microsecond, time.Duration(uint32(m))*time.Microsecond
	return min((3*srtt+max(r.floor, 4*rttvar))<<backoff, ceiling), backoff
}

// expired takes the expiry of a call whose timeout had backoff: the first
// of the calls under that timeout doubles it.
func (r *roundTrips) expired(backoff uint32) {
	if backoff < maxBackoff {
		r.backoff.CompareAndSwap(backoff, backoff+1)
	}
}

// answered takes the round trip of a call that Redis answered, with a
// reply or an error of its own. The first after an expiry starts the
// measurement anew, as the first of all does (RFC 6298, 5.7): the round
// trips smoothed before the expiry are of another link.
func (r *roundTrips) answered(rtt time.Duration) {
	anew := r.backoff.Load() != 0 && r.backoff.Swap(0) != 0
	sample := uint64(min(max(rtt, time.Microsecond), maxCallTimeout) / time.Microsecond)
	for {
		old := r.measured.Load()
		next := sample<<32 | sample/2 // the first: its deviation half of it
		if old != 0 && !anew {
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
