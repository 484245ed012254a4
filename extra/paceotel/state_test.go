package paceotel

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/fleetpace/pace"
)

// TestSleepersMatchAModel: random adds, cancels and counts, on a clock
// that moves ahead, keep the sleepers as a sorted list of wakes would: a
// count is the wakes after now, a cancel forgets the latest.
func TestSleepersMatchAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s sleepers
	var model []int64
	now := time.Unix(0, 0)
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		model = slices.DeleteFunc(model, func(w int64) bool { return w <= now.UnixNano() })
		switch op := rng.IntN(10); {
		case op < 6:
			wake := now.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
			s.add(now, wake)
			model = append(model, wake.UnixNano())
		case op < 8:
			s.cancel(now)
			if len(model) > 0 {
				model = slices.Delete(model, slices.Index(model, slices.Max(model)), slices.Index(model, slices.Max(model))+1)
			}
		default:
			if got := s.count(now); got != int64(len(model)) {
				t.Fatalf("step %d: %d asleep, want %d", step, got, len(model))
			}
		}
	}
	if in := len(s.wakes) - len(s.free); in != len(s.heaps[earliest]) || in != len(s.heaps[latest]) {
		t.Errorf("%d sleepers in use, heaps of %d and %d: want all three equal", in, len(s.heaps[earliest]), len(s.heaps[latest]))
	}
}

// TestObserverBoundedWithoutAReader: with a no-op MeterProvider (what a
// program has before it installs an SDK), whose callbacks never run,
// 500,000 waits of a millisecond, then cuts of as many keys' rates, leave
// the heap where it was: the callers asleep are forgotten as they wake,
// and the rates as they recover. (It grew 5.1-6.6 MiB over 540-770k
// waits, never freed.)
func TestObserverBoundedWithoutAReader(t *testing.T) {
	observe, err := NewObserver(WithMeterProvider(noop.NewMeterProvider()), WithKey())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range 500000 {
		observe(ctx, pace.Event{Kind: pace.EventWait, Limiter: "redis", Key: "k", Cost: 1, Delay: time.Microsecond})
		if i%1000 == 0 {
			observe(ctx, pace.Event{Kind: pace.EventRate, Limiter: "redis", Key: "host" + string(rune('a'+i%26)) + time.Now().String(), Rate: 0.5, Delay: time.Microsecond})
		}
	}
	grew := int64(heap()) - int64(before)
	runtime.KeepAlive(observe) // the observer is live throughout, as a program's is
	if grew > 256<<10 {
		t.Errorf("the heap grew %d KiB over 500,000 waits with no reader, want at most 256", grew>>10)
	}
}

// BenchmarkSleepersCancel: a cancellation and the wait that follows,
// among 1,000 callers asleep (the baseline) and among 100,000; it was a
// scan of half the heap, and is O(log n).
func BenchmarkSleepersCancel(b *testing.B) {
	var base float64
	for _, n := range []int{1000, 100000} {
		b.Run(map[int]string{1000: "asleep=1k", 100000: "asleep=100k"}[n], func(b *testing.B) {
			var s sleepers
			now := time.Unix(0, 0)
			rng := rand.New(rand.NewPCG(1, 2))
			for range n {
				s.add(now, now.Add(time.Hour+time.Duration(rng.IntN(int(time.Hour)))))
			}
			for b.Loop() {
				s.cancel(now)
				s.add(now, now.Add(time.Hour+time.Duration(rng.IntN(int(time.Hour)))))
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if n == 1000 {
				base = perOp
			}
			b.ReportMetric(perOp/base, "x-1k")
		})
	}
}
