package pace

import (
	"context"
	"log/slog"
)

// SlogObserver returns an Observer that logs each event to logger: a
// fallback to local pacing, an abandoned slot and limits that disagree at
// Warn; a recovery, a hold and its end, a learned limit and a lapsed slot
// at Info; everything else (waits, refusals, cancellations, readings,
// slots) at Debug. Each record says the event's kind, limiter and key (its
// first 64 bytes), and its cost, delay, reason and error when it has them,
// and dry_run for a dry run's.
func SlogObserver(logger *slog.Logger) Observer {
	return func(ctx context.Context, e Event) {
		level := slogLevel(e.Kind)
		if !logger.Enabled(ctx, level) {
			return
		}
		key := e.Key
		if len(key) > 64 { // a megabyte key makes no megabyte record
			key = key[:64] + "..."
		}
		attrs := []slog.Attr{slog.String("limiter", e.Limiter), slog.String("key", key)}
		if e.Cost != 0 {
			attrs = append(attrs, slog.Int("cost", e.Cost))
		}
		if e.Delay != 0 {
			attrs = append(attrs, slog.Duration("delay", e.Delay))
		}
		if e.Reason != "" {
			attrs = append(attrs, slog.String("reason", e.Reason))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		if e.DryRun {
			attrs = append(attrs, slog.Bool("dry_run", true))
		}
		logger.LogAttrs(ctx, level, "pace: "+e.Kind.String(), attrs...)
	}
}

// slogLevel is the level SlogObserver logs events of kind k at.
func slogLevel(k EventKind) slog.Level {
	switch k {
	case EventFallback, EventProbe, EventSlotAbandon, EventMismatch:
		return slog.LevelWarn
	case EventRecover, EventRepay, EventHold, EventHoldCapped, EventHoldEnd, EventLearned, EventSlotExpire:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
