package paceotel

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/redistest"
)

// TestObserver: a Redis limiter with the observer, against a real
// redis-server: 5 grants (3 of them after a wait), a refusal, a
// cancellation, a hold; then Redis killed, and a grant by the fallback.
// The manual reader sees each, with its attributes; the span of a request
// has its wait.
func TestObserver(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observer, err := NewObserver(WithMeterProvider(mp), WithName("api"))
	if err != nil {
		t.Fatal(err)
	}
	if err := InstrumentClient(client, WithMeterProvider(mp), WithName("api")); err != nil {
		t.Fatal(err)
	}
	r, err := pace.NewRedis(client, pace.PerSecond(50).WithBurst(2), pace.WithObserver(observer), pace.WithFleetSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	spans := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)).Tracer("test")
	for range 5 { // 2 at once, then 20 ms each
		spanCtx, span := tracer.Start(ctx, "request")
		if err := r.Wait(spanCtx, "k", 1); err != nil {
			t.Fatal(err)
		}
		span.End()
	}
	asleep, cancel := context.WithCancel(ctx) // books 20 ms ahead, then is cancelled
	time.AfterFunc(5*time.Millisecond, cancel)
	if err := r.Wait(asleep, "k", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled wait: %v", err)
	}
	if err := r.Hold(ctx, "k", headers.Hold{For: 2 * time.Second, Reason: "429 Retry-After: 2"}); err != nil {
		t.Fatal(err)
	}
	deadline, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	if err := r.Wait(deadline, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the refused wait: %v", err)
	}
	stop()
	srv.Kill()
	if err := r.Wait(ctx, "other", 1); err != nil { // by the fallback, at the fleet's share
		t.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, result := range []string{Granted, GrantedFallback, Refused, Cancelled} {
		got[result] = sumOf(t, rm, "pace.decisions", attribute.String("pace.result", result))
	}
	waits := histogramOf(t, rm, "pace.wait.duration")
	t.Logf("decisions %v; waits: %d, %.3f s in all; holds %d; unavailable %d; script calls timed %d",
		got, waits.Count, waits.Sum, sumOf(t, rm, "pace.holds"), sumOf(t, rm, "pace.redis.unavailable"), histogramOf(t, rm, "pace.redis.call.duration").Count)
	if got[Granted] != 6 || got[GrantedFallback] != 1 || got[Refused] != 1 || got[Cancelled] != 1 {
		t.Errorf("decisions %v, want 6 granted (one of them then cancelled), 1 by the fallback, 1 refused, 1 cancelled", got)
	}
	if waits.Count != 7 || waits.Sum < 0.07 || waits.Sum > 0.12 {
		t.Errorf("%d waits, %.3f s in all; want 7, about 3 x 20 ms, and the cancelled one's 20 ms", waits.Count, waits.Sum)
	}
	if n := sumOf(t, rm, "pace.holds"); n != 1 || histogramOf(t, rm, "pace.hold.duration").Sum != 2 {
		t.Errorf("%d holds, want 1 of 2 s", n)
	}
	if n := sumOf(t, rm, "pace.redis.unavailable"); n != 1 {
		t.Errorf("pace.redis.unavailable %d after the kill, want 1", n)
	}
	if n := histogramOf(t, rm, "pace.redis.call.duration").Count; n < 9 {
		t.Errorf("%d script calls timed, want at least the 9 decisions' and the hold's", n)
	}
	if n := sumOf(t, rm, "pace.decisions", attribute.String("pace.name", "api")); n != 9 {
		t.Errorf("%d decisions named api, want all 9", n)
	}
	var waitEvents int
	for _, s := range spans.Ended() {
		for _, e := range s.Events() {
			var delay float64
			var ends time.Time
			for _, kv := range e.Attributes {
				switch kv.Key {
				case "pace.delay":
					delay = kv.Value.AsFloat64()
				case "pace.ends":
					ends, _ = time.Parse(time.RFC3339Nano, kv.Value.AsString())
				}
			}
			if e.Name == "pace.wait" && ends.Sub(e.Time).Seconds()-delay < 1e-6 && ends.Sub(e.Time).Seconds()-delay > -1e-6 {
				waitEvents++
			}
		}
	}
	if waitEvents != 5 {
		t.Errorf("%d pace.wait span events that end their delay after they begin, want one on each of the 5 spans", waitEvents)
	}
}

// sumOf sums the points of the counter or gauge name whose attributes
// include want.
func sumOf(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var sum int64
	for _, m := range metricsNamed(rm, name) {
		var points []metricdata.DataPoint[int64]
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			points = data.DataPoints
		case metricdata.Gauge[int64]:
			points = data.DataPoints
		default:
			t.Fatalf("%s is a %T", name, m.Data)
		}
		for _, p := range points {
			if has(p.Attributes, want) {
				sum += p.Value
			}
		}
	}
	return sum
}

// histogramOf merges the points of the histogram name.
func histogramOf(t *testing.T, rm metricdata.ResourceMetrics, name string) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	var all metricdata.HistogramDataPoint[float64]
	for _, m := range metricsNamed(rm, name) {
		data, ok := m.Data.(metricdata.Histogram[float64])
		if !ok {
			t.Fatalf("%s is a %T", name, m.Data)
		}
		for _, p := range data.DataPoints {
			all.Count += p.Count
			all.Sum += p.Sum
		}
	}
	return all
}

func metricsNamed(rm metricdata.ResourceMetrics, name string) []metricdata.Metrics {
	var found []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				found = append(found, m)
			}
		}
	}
	return found
}

func has(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// TestObserverRate: a Transport on a Local limiter at 100/s whose upstream
// answers every request a plain 429, which says nothing of why: once a
// round of refusals has been weighed (100 ms, 10 requests), the key's rate
// is cut by half, the most a round cuts, and the observer counts the cut
// and gauges its share, 50% of the configured rate; until then the share
// is 1.
func TestObserverRate(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	observer, err := NewObserver(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTooManyRequests) }))
	defer api.Close()
	lim, err := pace.NewLocal(pace.PerSecond(100).WithBurst(1), pace.WithObserver(observer))
	if err != nil {
		t.Fatal(err)
	}
	share := func() float64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, m := range metricsNamed(rm, "pace.rate") {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && len(g.DataPoints) == 1 {
				return g.DataPoints[0].Value
			}
		}
		t.Fatal("no pace.rate")
		return 0
	}
	if s := share(); s != 1 {
		t.Errorf("pace.rate %v before any refusal, want 1", s)
	}
	client := &http.Client{Transport: &pace.Transport{Limiter: lim}}
	var cuts int64
	for sent := 0; cuts == 0 && sent < 30; sent++ {
		resp, err := client.Get(api.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		cuts = sumOf(t, rm, "pace.rate.cuts")
	}
	if s := share(); s != 0.5 || cuts != 1 {
		t.Errorf("after plain 429s: pace.rate %v, %d cuts; want 0.5 and 1", s, cuts)
	}
}
