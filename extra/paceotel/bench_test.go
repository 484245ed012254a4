package paceotel

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/redistest"
)

// BenchmarkObserver: a Redis decision with the observer recording into the
// OpenTelemetry SDK, beside one without an observer, in the same run; both
// on a limit never exhausted, so that each is one script call.
func BenchmarkObserver(b *testing.B) {
	ctx := context.Background()
	client := redistest.Start(b).Client(b)
	unlimited := pace.PerSecond(1e6).WithBurst(1e12)
	plain, err := pace.NewRedis(client, unlimited, pace.WithFleetSize(1))
	if err != nil {
		b.Fatal(err)
	}
	defer plain.Close()
	observer, err := NewObserver(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
	if err != nil {
		b.Fatal(err)
	}
	observed, err := pace.NewRedis(client, unlimited, pace.WithFleetSize(1), pace.WithObserver(observer))
	if err != nil {
		b.Fatal(err)
	}
	defer observed.Close()
	var base float64
	for _, run := range []struct {
		name string
		r    *pace.Redis
	}{{"without", plain}, {"paceotel", observed}} {
		b.Run(run.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := run.r.Wait(ctx, "api.example.com:443", 1); err != nil {
					b.Fatal(err)
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if run.r == plain {
				base = perOp
			}
			b.ReportMetric(perOp/base, "x-without")
		})
	}
}
