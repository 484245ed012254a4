package pace

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestSlogObserver: each kind of event is logged at its level, with what
// it carries; below the handler's level nothing is formatted.
func TestSlogObserver(t *testing.T) {
	var out bytes.Buffer
	observe := SlogObserver(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	for _, tc := range []struct {
		e    Event
		want string
	}{
		{Event{Kind: EventFallback, Limiter: "redis", Key: "k", Cost: 1, Err: errors.New("dial tcp: refused")}, `level=WARN msg="pace: fallback" limiter=redis key=k cost=1 error="dial tcp: refused"`},
		{Event{Kind: EventRecover, Limiter: "redis", Key: "k", Delay: 2 * time.Second}, `level=INFO msg="pace: recover" limiter=redis key=k delay=2s`},
		{Event{Kind: EventHold, Limiter: "redis", Key: "k", Delay: time.Second, Reason: "429 Retry-After: 1"}, `level=INFO msg="pace: hold" limiter=redis key=k delay=1s reason="429 Retry-After: 1"`},
		{Event{Kind: EventWait, Limiter: "local", Key: "k", Cost: 2, Delay: 5 * time.Millisecond}, `level=DEBUG msg="pace: wait" limiter=local key=k cost=2 delay=5ms`},
		{Event{Kind: EventWait, Limiter: "redis", Key: "k", Cost: 1, Delay: time.Second, DryRun: true}, `level=DEBUG msg="pace: wait" limiter=redis key=k cost=1 delay=1s dry_run=true`},
		{Event{Kind: EventMismatch, Limiter: "redis", Key: "k", Reason: "this process paces the key at 200/s"}, `level=WARN msg="pace: mismatch" limiter=redis key=k reason="this process paces the key at 200/s"`},
		{Event{Kind: EventSlotAbandon, Limiter: "redis", Key: "k", Cost: 1, Delay: 3 * time.Second}, `level=WARN msg="pace: slot-abandon" limiter=redis key=k cost=1 delay=3s`},
	} {
		out.Reset()
		observe(context.Background(), tc.e)
		if got := out.String(); !strings.Contains(got, tc.want) {
			t.Errorf("%v: logged %q, want %q", tc.e.Kind, got, tc.want)
		}
	}
	out.Reset()
	quiet := SlogObserver(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})))
	quiet(context.Background(), Event{Kind: EventWait, Key: "k"})
	if out.Len() != 0 {
		t.Errorf("a wait at level Info: logged %q, want nothing", out.String())
	}
}
