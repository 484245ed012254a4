package paceotel

import (
	"context"
	"time"

	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// InstrumentClient records the duration of each script call (FCALL,
// EVALSHA, EVAL) that client makes, pace's decisions among them, as the
// histogram pace.redis.call.duration, in seconds, with the attribute
// pace.outcome ("ok" or "error"; a script's NOSCRIPT answer, which go-redis
// follows with EVAL, or a function's first "not found", which pace follows
// by loading its library, is an error).
func InstrumentClient(client redis.UniversalClient, opts ...Option) error {
	c := newConfig(opts)
	calls, err := c.meters.Meter(meterName).Float64Histogram("pace.redis.call.duration", metric.WithUnit("s"),
		metric.WithDescription("How long each script call to Redis takes."), metric.WithExplicitBucketBoundaries(callBuckets...))
	if err != nil {
		return err
	}
	base := attribute.NewSet()
	if c.name != "" {
		base = attribute.NewSet(attribute.String("pace.name", c.name))
	}
	client.AddHook(callTimer{calls: calls, ok: withOutcome(base, "ok"), failed: withOutcome(base, "error")})
	return nil
}

// callBuckets are the boundaries of pace.redis.call.duration, in seconds:
// from 50 µs to a second.
var callBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

func withOutcome(base attribute.Set, outcome string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(base.ToSlice(), attribute.String("pace.outcome", outcome))...))
}

// callTimer is the go-redis hook of InstrumentClient.
type callTimer struct {
	calls      metric.Float64Histogram
	ok, failed metric.MeasurementOption
}

func (h callTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h callTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !store.IsScriptCall(cmd.Name()) {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		outcome := h.ok
		if err != nil && err != redis.Nil {
			outcome = h.failed
		}
		h.calls.Record(ctx, time.Since(start).Seconds(), outcome)
		return err
	}
}

func (h callTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
