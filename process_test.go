package pace

import (
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestProcessIsAValue: limiters built with one Process count as one member
// of their fleet and share its outage limiters; limiters of two Processes
// in one program are two members, each with its own; a Process without a
// name is refused, naming the fix.
func TestProcessIsAValue(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { c.Close() })
	a, b := NewNamedProcess("a"), NewNamedProcess("b")
	a1 := mustRedis(t, c, PerSecond(10), WithProcess(a))
	a2 := mustRedis(t, c, PerSecond(10), WithProcess(a))
	b1 := mustRedis(t, c, PerSecond(10), WithProcess(b))
	if a1.fleet.member != "a" || a2.fleet.member != "a" || b1.fleet.member != "b" {
		t.Errorf("members %q, %q, %q; want a, a, b", a1.fleet.member, a2.fleet.member, b1.fleet.member)
	}
	if !strings.HasPrefix(a1.id, "a:") || a1.id == a2.id {
		t.Errorf("limiter ids %q and %q; want two of process a", a1.id, a2.id)
	}
	now := a1.now()
	shared, again, other := a1.fallbackLimiter(now, nil), a2.fallbackLimiter(now, nil), b1.fallbackLimiter(now, nil)
	if shared != again || shared == other {
		t.Error("outage limiters: want one for process a's two limiters, another for process b's")
	}
	if d := mustRedis(t, c, PerSecond(10)); d.fleet.member != thisProcess().member {
		t.Errorf("default member %q, want the program's own %q", d.fleet.member, thisProcess().member)
	}
	if _, err := NewRedis(c, PerSecond(10), WithProcess(&Process{})); err == nil || !strings.Contains(err.Error(), "NewNamedProcess") {
		t.Errorf("a zero Process: %v; want an error naming NewNamedProcess", err)
	}
}
