package outage

import (
	"sync/atomic"
	"time"
)

// breaker confirms that Redis is away before a process leaves it. One call
// that fails or passes its timeout says little: a lost packet, one slow
// script, or a pause of this process, after which every call it had under
// way times out at once, though Redis answered them all. An outage begun on
// that puts the process's local share on top of what the rest of the fleet
// books in Redis. So an error opens the breaker only when a call that
// began after the first failure of its row (with no answer between them)
// fails too: once it took half a call timeout or more (Redis silent for
// that long again), or at the second such call (an error that comes at
// once, such as OOM). An expiry (store.IsExpiry: Redis did not answer in
// time) doubles the call timeout, as TCP's timer backs off, and
// never opens the breaker early: a Redis whose round trips jumped past the
// timeout (a failover to another zone, a congested path) answers the next
// call, or one after, which a new connection's handshake may need; unless
// the call was given the ceiling (store.MaxCallTimeout: a limiter that Redis
// never answered, or one backed off all the way), when its expiry confirms:
// a request's calls at the ceiling would pass any budget before they
// confirmed one by one (a limiter made while Redis was silent never left
// it). Until
// then, the request that met the failure asks Redis again, within
// its deadline; its own ConfirmRow-th failure in a row confirms the
// outage, so that it never asks without end (a cluster whose other nodes
// answer breaks every row). Its fields but answers are the failover's,
// under its lock.
type breaker struct {
	// answers counts the calls Redis answered (kept by the caller, or a
	// test's store): a row of failures ends at an answer.
	answers *atomic.Uint64

	rowAnswers uint64    // answers when the row began
	rowSince   time.Time // when its first failure was; zero for no row
	retried    int       // failures of calls begun since rowSince
}

// ConfirmRow is how many failures in a row of one request confirm an
// outage; one more when the last is an expiry, so that a request's calls
// wait 1, 2, 4 and 8 times the timeout before a Redis that answers is
// taken for away: a new connection's handshake takes two round trips or
// three more than a call on an open one.
const ConfirmRow = 3

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// confirms records the failure at now of a call that began at began, its
// caller's failures-th in a row, and reports whether it confirms an
// outage; timeout is the call timeout, expired says that the failure was
// an expiry, and ceiling that it was one of a call given MaxCallTimeout.
func (b *breaker) confirms(now, began time.Time, timeout time.Duration, failures int, expired, ceiling bool) bool {
	var answers uint64
	if b.answers != nil {
		answers = b.answers.Load()
	}
	if b.rowSince.IsZero() || answers != b.rowAnswers {
		b.rowAnswers, b.rowSince, b.retried = answers, now, 0 // a row begins
	} else if !began.Before(b.rowSince) {
		b.retried++
	}
	early := !expired && (b.retried >= 2 || b.retried == 1 && now.Sub(b.rowSince) >= timeout/2) ||
		ceiling // the timeout could back off no further
	if failures < ConfirmRow+btoi(expired) && !early {
		return false
	}
	b.rowSince = time.Time{}
	return true
}
