// Package paceotel records what pace's limiters do as OpenTelemetry metrics
// and span events. It is a module of its own, so that pace itself does not
// depend on OpenTelemetry.
//
//	observer, err := paceotel.NewObserver(paceotel.WithName("github"))
//	limiter, err := pace.NewRedis(client, quota, pace.WithObserver(observer))
//
// OpenTelemetry has no convention for rate limiting yet; the names follow
// ASP.NET Core's aspnetcore.rate_limiting.* where they can:
//
//	pace.decisions          counter   decisions, by pace.result: granted,
//	                                  granted_fallback (by the local fallback
//	                                  or fail-open while Redis is away),
//	                                  refused, cancelled, failed
//	pace.wait.duration      histogram seconds a granted request waits
//	                                  (buckets from 1 ms to 60 s)
//	pace.waiting            up-down   callers asleep now
//	pace.holds              counter   holds the upstream asked for
//	pace.hold.duration      histogram seconds each hold lasts
//	pace.rate               gauge     the share of its configured rate a key
//	                                  goes at after refusals the upstream gave
//	                                  without saying why (1: none), the last
//	                                  key cut's (by key, WithKey)
//	pace.rate.cuts          counter   the cuts of keys' rates
//	pace.redis.unavailable  gauge     1 while the limiter paces without Redis
//	pace.redis.call.duration histogram seconds of each script call (see
//	                                  InstrumentClient)
//
// Their attributes are pace.limiter ("redis", "local" or "open"), pace.name
// (WithName: a rule's or limit's name) and pace.result: few values each.
// The key a request was paced under is not one by default: it can name a
// host, or carry a hashed token, and a fleet may use millions; WithKey adds
// it as pace.key, for a fleet whose keys are few.
//
// On the request's span (the one in its context), the observer adds an
// event "pace.wait" for each wait, as it begins (pace.delay in seconds,
// pace.ends when it ends, pace.limiter), "pace.hold" for a hold it set,
// and "pace.refuse" for a refusal.
package paceotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetpace/pace"
)

// The results of pace.decisions.
const (
	Granted         = "granted"
	GrantedFallback = "granted_fallback"
	Refused         = "refused"
	Cancelled       = "cancelled"
	Failed          = "failed"
)

// waitBuckets are the boundaries of pace.wait.duration, in seconds.
var waitBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// An Option configures NewObserver or InstrumentClient.
type Option func(*config)

type config struct {
	meters metric.MeterProvider
	name   string
	key    bool
}

// WithMeterProvider sets the MeterProvider; the default is the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meters = mp }
}

// WithName sets the pace.name attribute of every measurement: the name of
// the limiter's rule or quota.
func WithName(name string) Option {
	return func(c *config) { c.name = name }
}

// WithKey adds the key of each request as the attribute pace.key. Each key
// is a time series of its own: use it only when the keys are few.
func WithKey() Option {
	return func(c *config) { c.key = true }
}

func newConfig(opts []Option) config {
	c := config{meters: otel.GetMeterProvider()}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// meterName names the meter of pace's instruments.
const meterName = "github.com/fleetpace/pace"

// observer holds the instruments and what the observable ones read.
type observer struct {
	config
	decisions    metric.Int64Counter
	waits        metric.Float64Histogram
	holds        metric.Int64Counter
	holdLengths  metric.Float64Histogram
	rateCuts     metric.Int64Counter
	asleep       sleepers
	rates        rates
	unavailable  unavailable
	mu           sync.Mutex
	attributeSet map[[2]string]metric.MeasurementOption // by limiter and result
}

// NewObserver returns a pace.Observer that records each event as metrics
// and span events (see the package doc).
func NewObserver(opts ...Option) (pace.Observer, error) {
	o := &observer{config: newConfig(opts), attributeSet: make(map[[2]string]metric.MeasurementOption)}
	meter := o.meters.Meter(meterName)
	var errs [8]error
	o.decisions, errs[0] = meter.Int64Counter("pace.decisions", metric.WithUnit("{decision}"), metric.WithDescription("Decisions of pace's limiters, by result."))
	o.waits, errs[1] = meter.Float64Histogram("pace.wait.duration", metric.WithUnit("s"), metric.WithDescription("How long a granted request waits."), metric.WithExplicitBucketBoundaries(waitBuckets...))
	o.holds, errs[2] = meter.Int64Counter("pace.holds", metric.WithUnit("{hold}"), metric.WithDescription("Holds the upstream asked for."))
	o.holdLengths, errs[3] = meter.Float64Histogram("pace.hold.duration", metric.WithUnit("s"), metric.WithDescription("How long each hold lasts."), metric.WithExplicitBucketBoundaries(waitBuckets...))
	_, errs[4] = meter.Int64ObservableUpDownCounter("pace.waiting", metric.WithUnit("{request}"), metric.WithDescription("Callers asleep now."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			obs.Observe(o.asleep.count(time.Now()), metric.WithAttributes(o.base()...))
			return nil
		}))
	_, errs[5] = meter.Int64ObservableGauge("pace.redis.unavailable", metric.WithUnit("1"), metric.WithDescription("1 while the limiter paces without Redis."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			obs.Observe(o.unavailable.value(), metric.WithAttributes(o.base()...))
			return nil
		}))
	o.rateCuts, errs[6] = meter.Int64Counter("pace.rate.cuts", metric.WithUnit("{cut}"), metric.WithDescription("Cuts of keys' rates after refusals."))
	_, errs[7] = meter.Float64ObservableGauge("pace.rate", metric.WithUnit("1"), metric.WithDescription("The share of its configured rate a key goes at after refusals."),
		metric.WithFloat64Callback(func(_ context.Context, obs metric.Float64Observer) error {
			o.rates.each(time.Now(), func(key string, share float64) {
				kvs := o.base()
				if key != "" {
					kvs = append(kvs, attribute.String("pace.key", key))
				}
				obs.Observe(share, metric.WithAttributes(kvs...))
			})
			return nil
		}))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return o.observe, nil
}

// observe records one event.
func (o *observer) observe(ctx context.Context, e pace.Event) {
	switch e.Kind {
	case pace.EventWait:
		result := Granted
		if e.Err != nil { // decided without Redis
			result = GrantedFallback
		}
		o.decisions.Add(ctx, 1, o.attributes(e, result))
		o.waits.Record(ctx, e.Delay.Seconds(), o.attributes(e, ""))
		if e.Delay > 0 && !e.DryRun { // a dry run's caller does not sleep
			now := time.Now()
			o.asleep.add(now, now.Add(e.Delay))
		}
		spanEvent(ctx, "pace.wait", e)
	case pace.EventRefuse:
		o.decisions.Add(ctx, 1, o.attributes(e, Refused))
		spanEvent(ctx, "pace.refuse", e)
	case pace.EventCancel:
		o.decisions.Add(ctx, 1, o.attributes(e, Cancelled))
		o.asleep.cancel(time.Now())
	case pace.EventFail:
		o.decisions.Add(ctx, 1, o.attributes(e, Failed))
	case pace.EventHold:
		o.holds.Add(ctx, 1, o.attributes(e, ""))
		o.holdLengths.Record(ctx, e.Delay.Seconds(), o.attributes(e, ""))
		spanEvent(ctx, "pace.hold", e)
	case pace.EventRate:
		if e.Rate < 1 {
			o.rateCuts.Add(ctx, 1, o.attributes(e, ""))
		}
		key := ""
		if o.key {
			key = e.Key
		}
		now := time.Now()
		o.rates.set(now, key, e.Rate, now.Add(e.Delay))
	case pace.EventFallback:
		o.unavailable.set(true)
	case pace.EventRecover:
		o.unavailable.set(false)
	}
}

// base is the attributes every measurement has.
func (o *observer) base() []attribute.KeyValue {
	if o.name == "" {
		return nil
	}
	return []attribute.KeyValue{attribute.String("pace.name", o.name)}
}

// attributes is the attribute set of e's measurement with result (none when
// ""), made once for each limiter and result (and each key, WithKey).
func (o *observer) attributes(e pace.Event, result string) metric.MeasurementOption {
	if o.key {
		return metric.WithAttributeSet(o.set(e.Limiter, result, e.Key))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	id := [2]string{e.Limiter, result}
	set, ok := o.attributeSet[id]
	if !ok {
		set = metric.WithAttributeSet(o.set(e.Limiter, result, ""))
		o.attributeSet[id] = set
	}
	return set
}

func (o *observer) set(limiter, result, key string) attribute.Set {
	kvs := append(o.base(), attribute.String("pace.limiter", limiter))
	if result != "" {
		kvs = append(kvs, attribute.String("pace.result", result))
	}
	if key != "" {
		kvs = append(kvs, attribute.String("pace.key", key))
	}
	return attribute.NewSet(kvs...)
}

// spanEvent adds an event named name for e to the span in ctx, if it is
// recording.
func spanEvent(ctx context.Context, name string, e pace.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	now := time.Now()
	span.AddEvent(name, trace.WithTimestamp(now), trace.WithAttributes(
		attribute.String("pace.limiter", e.Limiter),
		attribute.Float64("pace.delay", e.Delay.Seconds()),
		attribute.String("pace.ends", now.Add(e.Delay).UTC().Format(time.RFC3339Nano)),
		attribute.Int("pace.cost", e.Cost),
		attribute.String("pace.reason", e.Reason),
	))
}
