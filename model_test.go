package pace

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
)

// bucketModel is a plain Go model of the two Redis scripts: the same GCRA
// schedule and the same gaps, in integer microseconds, on a clock the caller
// passes in, and the steering of the upstream's counters (steerModel).
// Property tests hold the scripts to it.
type bucketModel struct {
	tat    map[string]int64
	gaps   map[string]map[int64]int64 // key → finish → size
	steers map[string]*steerModel     // key → its steering, once steered
	holds  map[string]int64           // key → when its latest hold ends
	rates  map[string]*steer.Rate     // key → its rate after refusals (steer.Rate is the model of rate.lua)

	trimmed int // the buckets whose queue a wake trimmed (see trimQueues), for the model checks' counts
}

func newBucketModel() *bucketModel {
	return &bucketModel{tat: make(map[string]int64), gaps: make(map[string]map[int64]int64), steers: make(map[string]*steerModel),
		holds: make(map[string]int64), rates: make(map[string]*steer.Rate)}
}

// reserve is reserve.lua: the caller cannot go before now + notBefore, nor
// before the key's hold ends, nor before its rate lets it. It returns what
// the script replies: whether it was granted, its delay, the bucket's TAT
// after it (finishes[0]), the steered bucket's count of units booked (else
// 0), and whether the key's rate listens for a success, or was dropped.
// cost is a reservation's estimate when estimated; again, the request is
// booked anew.
func (m *bucketModel) reserve(key string, interval, burst, cost, budget, notBefore, now int64, estimated, again bool) store.Booking {
	m.expire(key, now)
	s, arrival := m.steers[key], max(now+notBefore, m.holds[key])
	var b store.Booking
	rate, unit := m.keyRate(key, now, &b), cost*s.interval(interval)
	arrival = rate.Allow(now, arrival, unit)
	due := max(arrival, s.allow(m.tat[key], interval, burst, cost, arrival, now))
	b.Delay, b.Now = store.Microseconds(due-now), now
	b.Finishes[0] = s.finish(m.tat[key], interval, burst, cost, due, now, due == now)
	if due-now > budget {
		return b
	}
	rate.Book(now, due, unit, again)
	b.Granted, b.Booked[0] = true, m.book(key, interval, b.Finishes[0], cost, known(estimated, cost), due, now)
	return b
}

// has reports whether limit i is in s.
func has(s store.LimitSet, i int) bool { return s&(1<<i) != 0 }

// known is known in common.lua: the units of a booking's cost that move a
// bucket's CEILING, none of an estimate.
func known(estimated bool, cost int64) int64 {
	if estimated {
		return 0
	}
	return cost
}

// keyRate returns key's rate after refusals, as a booking at now finds it,
// and notes in b whether it listens for a success, or was dropped, back at
// the configured rate.
func (m *bucketModel) keyRate(key string, now int64, b *store.Booking) *steer.Rate {
	k := m.rateOf(key)
	b.Recovered, b.Listening = k.Recovered(now), k.Listening()
	return k
}

// rateOf returns key's rate after refusals, as refused.lua finds it: read
// with the key's hold.
func (m *bucketModel) rateOf(key string) *steer.Rate {
	k := m.rates[key]
	if k == nil {
		k = &steer.Rate{}
		m.rates[key] = k
	}
	k.Held(m.holds[key])
	return k
}

// A modelBucket is one of a key's buckets in the model: its key in the
// model's maps, its interval and its burst.
type modelBucket struct {
	key  string
	a, b int64
}

// refused is refused.lua, for a key whose buckets are buckets: it returns
// the share the key's rate goes at after a cut, or 0.
func (m *bucketModel) refused(key string, buckets []modelBucket, b store.Booking, served bool, before, now, burst int64) int64 {
	k := m.rateOf(key)
	if served {
		k.Served(b.Now)
		return 0
	}
	cut, wake := k.Refused(now, b.Now, burst, before)
	switch {
	case wake:
		m.trimQueues(buckets, now, true, cut)
	case cut:
		if after := m.trimQueues(buckets, now, false, true); after > 0 {
			k.Trim(after, now)
		}
	}
	if cut {
		return k.Bottom()
	}
	return 0
}

// trimQueues is refused.lua's trim_queues: each bucket's schedule beyond
// what the refusal keeps (steer.Kept; wake: it wakes the sleepers, cut:
// it cut the rate) is taken out, with its gaps there, and a steered
// bucket's CEILING gives back the same units. It returns the earliest due
// time past which a booking is no longer whole in a bucket, 0 when it
// took nothing.
func (m *bucketModel) trimQueues(buckets []modelBucket, now int64, wake, cut bool) (after int64) {
	for _, bk := range buckets {
		m.expire(bk.key, now)
		tat, ok := m.tat[bk.key]
		s := m.steers[bk.key]
		_, unit, _, _ := s.step(tat, bk.a, bk.b, now, now)
		kept := now + steer.Kept(bk.b*unit, wake, cut, s != nil)
		if !ok || tat <= kept {
			continue
		}
		if s != nil && s.ceiling > now {
			s.ceiling = max(s.ceiling-(tat-kept)/unit*s.interval(bk.a), now)
		}
		m.tat[bk.key] = kept
		m.trimmed++
		s.written(now)
		for finish := range m.gaps[bk.key] {
			if finish > kept {
				delete(m.gaps[bk.key], finish)
			}
		}
		if whole := kept - bk.b*unit; after == 0 || whole < after {
			after = whole
		}
	}
	return after
}

// book notes cost units booked at due in a bucket of interval a, leaving
// the schedule at finish, of which the fleet is known to spend spent, and
// returns the bucket's count of units booked (0 when not steered).
func (m *bucketModel) book(key string, a, finish, cost, spent, due, now int64) int64 {
	s := m.steers[key]
	m.tat[key] = finish
	s.moveCeiling(a, spent, due, now)
	s.written(now)
	return s.countBooked(cost)
}

// settle is settle.lua for a bucket of interval a and burst b: diff units
// more (or fewer) than booked move the schedule forward (or back, never
// before now), each as a booking's would, and its CEILING by spent, the
// units the fleet is known to have spent beyond what its booking counted.
func (m *bucketModel) settle(key string, a, b, units, spent, now int64) {
	m.expire(key, now)
	tat, ok := m.tat[key]
	s := m.steers[key]
	_, unit, _, _ := s.step(tat, a, b, now, now)
	diff := units * unit
	s.countBooked(units)
	s.moveCeiling(a, spent, now, now)
	switch {
	case diff > 0:
		m.tat[key] = min(max(tat, now)+diff, now+store.Horizon.Microseconds())
		s.written(now)
	case diff < 0 && ok && tat > now:
		s.movedBack(max(s.allow(tat, a, b, 1, now, now), now))
		if tat += diff; tat > now || s != nil {
			m.tat[key] = max(tat, now)
			s.written(now)
			for f := range m.gaps[key] {
				if f > tat {
					delete(m.gaps[key], f)
				}
			}
		} else {
			delete(m.tat, key)
			delete(m.gaps, key)
		}
	case s != nil && (units != 0 || spent != 0):
		s.written(now)
	}
}

// sync is sync.lua for one bucket of interval a and burst b, for a reading
// of a request of key booked as bk. bucket is the bucket's Redis key.
func (m *bucketModel) sync(key, bucket string, a, b int64, bk store.Booking, i int, st store.Steer, refused bool, now int64) int64 {
	m.expire(bucket, now)
	s := m.steers[bucket]
	tat, s, result := s.sync(m.tat[bucket], a, b, bk.Finishes[i], bk.Booked[i], bk.Due(), bk.Delay == 0, int64(bk.Costs[i]), refused,
		st, m.holds[key], now)
	if result > 0 || (refused && s != nil) {
		m.tat[bucket], m.steers[bucket] = tat, s
		s.written(now)
	}
	return result
}

// expire drops the schedule of a bucket not steered once Redis has expired
// it (common.lua's full_expiry: at the end of the second in which it is
// full again, in whole milliseconds, gone once Redis's clock is past them):
// a schedule that far back books as no schedule does, but the first
// reading that steers the bucket takes it in as it stands.
func (m *bucketModel) expire(key string, now int64) {
	tat, ok := m.tat[key]
	if !ok || m.steers[key] != nil || now/1000 <= (tat-tat%1_000_000)/1000+1000 {
		return
	}
	delete(m.tat, key)
	delete(m.gaps, key)
}

// hold is hold.lua, for a hold of key that outlasts the one in place: no
// request before end.
func (m *bucketModel) hold(key string, end int64) { m.holds[key] = end }

// refund is refund.lua.
func (m *bucketModel) refund(key string, finish, size, now int64) store.RefundResult {
	m.expire(key, now)
	tat, ok := m.tat[key]
	if !ok || m.steers[key] != nil || finish <= now || finish > tat {
		return store.RefundNothing
	}
	if m.gaps[key] == nil {
		m.gaps[key] = make(map[int64]int64)
	}
	if finish < tat {
		m.gaps[key][finish] = size
		return store.RefundGap
	}
	tat = finish - size
	for {
		gapSize, ok := m.gaps[key][tat]
		if !ok || !m.isTopGap(key, tat) {
			break
		}
		delete(m.gaps[key], tat)
		tat -= gapSize
	}
	for f := range m.gaps[key] {
		if f <= now {
			delete(m.gaps[key], f)
		}
	}
	m.tat[key] = tat
	return store.RefundTail
}

func (m *bucketModel) isTopGap(key string, finish int64) bool {
	for f := range m.gaps[key] {
		if f > finish {
			return false
		}
	}
	return true
}

// TestModelKeepsTheBound drives the model with random bookings, refunds and
// clock steps and checks the promise itself: the grants that stand (booked
// and not given back) within any interval of length t total at most b + r*t.
func TestModelKeepsTheBound(t *testing.T) {
	const interval, burst = 1000, 5 // 1000/s, burst 5, in microseconds
	rng := rand.New(rand.NewPCG(1, 2))
	m := newBucketModel()
	type grant struct{ at, cost, finish int64 }
	var grants []grant // booked and not given back
	refunds := map[store.RefundResult]int{}
	now := int64(1_000_000)
	for range 20000 {
		switch op := rng.IntN(10); {
		case op < 6:
			cost := rng.Int64N(burst) + 1
			budget := []int64{math.MaxInt64, 0, rng.Int64N(10 * interval), rng.Int64N(10 * interval)}[rng.IntN(4)]
			notBefore := []int64{0, 0, rng.Int64N(3 * interval)}[rng.IntN(3)]
			if b := m.reserve("k", interval, burst, cost, budget, notBefore, now, false, false); b.Granted {
				grants = append(grants, grant{now + b.Delay.Microseconds(), cost, b.Finishes[0]})
			}
		case op < 8 && len(grants) > 0:
			// Recent bookings are the ones still ahead, and only a caller
			// still asleep gives back.
			i := len(grants) - 1 - rng.IntN(min(len(grants), 8))
			if g := grants[i]; g.at > now {
				refunds[m.refund("k", g.finish, g.cost*interval, now)]++
				grants = slices.Delete(grants, i, i+1)
			}
		default:
			now += rng.Int64N(5 * interval)
		}
	}
	slices.SortFunc(grants, func(a, b grant) int { return cmp.Compare(a.at, b.at) })
	for i := range grants {
		var sum int64
		for j := i; j < len(grants); j++ {
			sum += grants[j].cost
			if span := grants[j].at - grants[i].at; sum*interval > burst*interval+span {
				t.Fatalf("grants %d..%d: %d tokens within %d µs, more than burst %d + rate*t", i, j, sum, span, burst)
			}
		}
	}
	if len(grants) < 2000 || refunds[store.RefundTail] < 100 || refunds[store.RefundGap] < 100 {
		t.Fatalf("%d grants, refunds %v: the sequence did not exercise the bucket", len(grants), refunds)
	}
}

// quotaModel is a plain Go model of quota.lua and of refund.lua for every
// kind of limit: buckets (by bucketModel), sliding windows (the times of
// their grants) and fixed windows (counts by window).
type quotaModel struct {
	buckets *bucketModel                // and the holds, by the key the caller names
	grants  map[string]map[string]int64 // sliding window key → member → time
	counts  map[string]map[int64]int64  // fixed window key → window → count
}

func newQuotaModel() *quotaModel {
	return &quotaModel{buckets: newBucketModel(), grants: map[string]map[string]int64{}, counts: map[string]map[int64]int64{}}
}

func windowGuard(length int64) int64 { return min(length-length%50, 2_500_000) / 50 }

// quotaReply is what quota.lua replies.
type quotaReply struct {
	granted              bool
	delay                int64
	finishes, booked     []int64
	listening, recovered bool
}

// reserve is quota.lua for key: limits[i] is kind, interval or length,
// burst or count, keys[i] its Redis key and costs[i] the request's cost
// under it. It returns whether the request was granted, its delay, each
// bucket's TAT after it, each steered bucket's count of units booked (else
// 0), and whether the key's rate listens for a success, or was dropped.
// The costs under the limits in estimated are a reservation's estimates.
func (m *quotaModel) reserve(key string, keys []string, limits [][3]int64, costs []int64, estimated store.LimitSet, again bool, budget, notBefore int64, id string, now int64) quotaReply {
	due := max(now+notBefore, m.buckets.holds[key])
	var b store.Booking
	rate := m.buckets.keyRate(key, now, &b)
	unit := m.rateUnit(keys, limits, costs)
	for i, l := range limits {
		kind, a, b, cost := l[0], l[1], l[2], costs[i]
		switch kind {
		case 1:
			due = max(due, m.buckets.steers[keys[i]].allow(m.buckets.tat[keys[i]], a, b, cost, now, now))
		case 2:
			var times []int64
			for _, at := range m.grants[keys[i]] {
				times = append(times, at)
			}
			slices.Sort(times)
			slices.Reverse(times)
			if len(times) > 0 {
				due = max(due, times[0])
			}
			if k := int(b - cost); k < len(times) {
				due = max(due, times[k]+a+windowGuard(a))
			}
		}
	}
	due = rate.Allow(now, due, unit)
	windows := make([]int64, len(limits))
	for moved := true; moved; {
		moved = false
		for i, l := range limits {
			if l[0] != 3 {
				continue
			}
			w := due / l[1]
			for m.counts[keys[i]][w]+costs[i] > l[2] {
				w++
			}
			if w*l[1] > due {
				due, moved = w*l[1], true
			}
			windows[i] = w
		}
	}
	finishes, booked := make([]int64, len(limits)), make([]int64, len(limits))
	for i, l := range limits {
		if l[0] == 1 {
			finishes[i] = m.buckets.steers[keys[i]].finish(m.buckets.tat[keys[i]], l[1], l[2], costs[i], due, now, due == now)
		}
	}
	reply := quotaReply{delay: due - now, finishes: finishes, booked: booked, listening: b.Listening, recovered: b.Recovered}
	if due-now > budget {
		return reply
	}
	rate.Book(now, due, unit, again)
	for i, l := range limits {
		switch l[0] {
		case 1:
			booked[i] = m.buckets.book(keys[i], l[1], finishes[i], costs[i], known(has(estimated, i), costs[i]), due, now)
		case 2:
			if m.grants[keys[i]] == nil {
				m.grants[keys[i]] = map[string]int64{}
			}
			for j := int64(1); j <= costs[i]; j++ {
				m.grants[keys[i]][fmt.Sprintf("%s:%d", id, j)] = due
			}
			m.trim(keys[i], l[2], now-l[1]-windowGuard(l[1]))
		case 3:
			if m.counts[keys[i]] == nil {
				m.counts[keys[i]] = map[int64]int64{}
			}
			m.counts[keys[i]][windows[i]] += costs[i]
		}
	}
	reply.granted = true
	return reply
}

// rateUnit is what a key's rate measures a request of costs under limits
// against (see rateUnit), as quota.lua takes it: a bucket's interval, the
// learned one if any, and a window's length over its count.
func (m *quotaModel) rateUnit(keys []string, limits [][3]int64, costs []int64) int64 {
	var lc store.LimitCosts
	for i := range limits {
		lc[i] = int(costs[i])
	}
	return rateUnit(&lc, len(limits), func(i int) int64 {
		if a, b := limits[i][1], limits[i][2]; limits[i][0] != 1 {
			return int64(math.Ceil(float64(a) / float64(b)))
		}
		return m.buckets.steers[keys[i]].interval(limits[i][1])
	})
}

// trim keeps a sliding window's latest count grants, in Redis's order (by
// time, then member), and none at or before old.
func (m *quotaModel) trim(key string, count, old int64) {
	type entry struct {
		member string
		at     int64
	}
	var entries []entry
	for member, at := range m.grants[key] {
		entries = append(entries, entry{member, at})
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.member, b.member))
	})
	for i, e := range entries {
		if int64(len(entries)-i) > count || e.at <= old {
			delete(m.grants[key], e.member)
		}
	}
}

// refund is refund.lua.
func (m *quotaModel) refund(keys []string, limits [][3]int64, costs []int64, id string, due int64, finishes []int64, now int64) []store.RefundResult {
	results := make([]store.RefundResult, len(limits))
	for i, l := range limits {
		cost := costs[i]
		switch l[0] {
		case 1:
			results[i] = m.buckets.refund(keys[i], finishes[i], cost*l[1], now)
		case 2:
			for j := int64(1); j <= cost; j++ {
				member := fmt.Sprintf("%s:%d", id, j)
				if _, ok := m.grants[keys[i]][member]; ok {
					delete(m.grants[keys[i]], member)
					results[i] = store.RefundTail
				}
			}
		case 3:
			if used, ok := m.counts[keys[i]][due/l[1]]; ok && due > now {
				m.counts[keys[i]][due/l[1]] -= min(cost, used)
				results[i] = store.RefundTail
			}
		}
	}
	return results
}

// settle is settle.lua, for a booking not settled before: under each limit,
// the difference between actual[i] and estimate[i] is charged or given back;
// the costs under the limits in estimated were estimates.
func (m *quotaModel) settle(keys []string, limits [][3]int64, estimate, actual []int64, estimated store.LimitSet, id string, due, now int64) {
	for i, l := range limits {
		kind, a, b := l[0], l[1], l[2]
		switch kind {
		case 1:
			m.buckets.settle(keys[i], a, b, actual[i]-estimate[i], actual[i]-known(has(estimated, i), estimate[i]), now)
		case 2:
			for j := actual[i] + 1; j <= estimate[i]; j++ {
				delete(m.grants[keys[i]], fmt.Sprintf("%s:%d", id, j))
			}
			if actual[i] > estimate[i] && (due+a+windowGuard(a))/1000 >= now/1000+1 {
				if m.grants[keys[i]] == nil {
					m.grants[keys[i]] = map[string]int64{}
				}
				for j := estimate[i] + 1; j <= min(actual[i], estimate[i]+b); j++ {
					m.grants[keys[i]][fmt.Sprintf("%s:%d", id, j)] = due
				}
			}
		case 3:
			if used, ok := m.counts[keys[i]][due/a]; ok {
				m.counts[keys[i]][due/a] += max(actual[i]-estimate[i], -used)
			}
		}
	}
}
