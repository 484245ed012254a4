package pace

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// bucketModel is a plain Go model of the two Redis scripts: the same GCRA
// schedule and the same gaps, in integer microseconds, on a clock the caller
// passes in. Property tests hold the scripts to it.
type bucketModel struct {
	tat  map[string]int64
	gaps map[string]map[int64]int64 // key → finish → size
}

func newBucketModel() *bucketModel {
	return &bucketModel{tat: make(map[string]int64), gaps: make(map[string]map[int64]int64)}
}

// reserve is reserve.lua: budget -1 means no limit.
func (m *bucketModel) reserve(key string, interval, burst, cost, budget, now int64) (granted bool, delay, finish int64) {
	tat := max(m.tat[key], now)
	finish = tat + cost*interval
	delay = max(finish-burst*interval-now, 0)
	if budget >= 0 && delay > budget {
		return false, delay, finish
	}
	m.tat[key] = finish
	return true, delay, finish
}

// refund is refund.lua.
func (m *bucketModel) refund(key string, finish, size, now int64) refundResult {
	tat, ok := m.tat[key]
	if !ok || finish <= now || finish > tat {
		return refundNothing
	}
	if m.gaps[key] == nil {
		m.gaps[key] = make(map[int64]int64)
	}
	if finish < tat {
		m.gaps[key][finish] = size
		return refundGap
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
	return refundTail
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
	refunds := map[refundResult]int{}
	now := int64(1_000_000)
	for range 20000 {
		switch op := rng.IntN(10); {
		case op < 6:
			cost := rng.Int64N(burst) + 1
			budget := []int64{-1, 0, rng.Int64N(10 * interval), rng.Int64N(10 * interval)}[rng.IntN(4)]
			if ok, delay, finish := m.reserve("k", interval, burst, cost, budget, now); ok {
				grants = append(grants, grant{now + delay, cost, finish})
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
	if len(grants) < 2000 || refunds[refundTail] < 100 || refunds[refundGap] < 100 {
		t.Fatalf("%d grants, refunds %v: the sequence did not exercise the bucket", len(grants), refunds)
	}
}
