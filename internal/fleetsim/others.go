package fleetsim

import "time"

// othersWay is the network way of the others' requests to the upstream
// (the processes' are 3 and up; Redis's, 0).
const othersWay = 1

// sendOthers starts the case's client outside the fleet: from the run's
// start, a request every 1/Others s for OthersFor (the whole run if 0),
// each arriving a trip of the upstream's link later, refused or not, as a
// client that does not listen sends them. None is sent when Others is 0.
// Each send sets the timer of the next, so that a fast client's run holds
// a timer or two, not all of its sends at once.
func (s *sim) sendOthers() {
	if s.c.Others <= 0 {
		return
	}
	end := s.end
	if s.c.OthersFor > 0 && s.start.Add(s.c.OthersFor).Before(end) {
		end = s.start.Add(s.c.OthersFor)
	}
	out, every := newLink(s.c, othersWay), seconds(1/s.c.Others)
	var send func(at time.Time)
	send = func(at time.Time) {
		time.AfterFunc(out.trip(at, nil), func() { s.up.arriveOthers(at) })
		if next := at.Add(every); next.Before(end) {
			time.AfterFunc(time.Until(next), func() { send(next) })
		}
	}
	send(s.start)
}

// arriveOthers judges a request of the others', sent at sent, at the
// model, and notes it apart from the fleet's.
func (u *upstream) arriveOthers(sent time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	v := u.model.admit(now, 1)
	u.others = append(u.others, arrival{sent: sent, at: now, proc: -1, cost: 1, ok: v.ok})
}
