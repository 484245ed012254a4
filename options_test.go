package pace

import (
	"strings"
	"testing"
	"time"
)

// TestRedisOptionsRefusedByLocal: an option of a Redis limiter alone makes
// NewLocal fail, naming the option and the fix; both limiters' options do
// not.
func TestRedisOptionsRefusedByLocal(t *testing.T) {
	redisOnly := map[string]Option{
		"WithPrefix":        WithPrefix("p:"),
		"WithCallTimeout":   WithCallTimeout(time.Second),
		"WithFailurePolicy": WithFailurePolicy(FailClosed),
		"WithFleetName":     WithFleetName("f"),
		"WithFleetSize":     WithFleetSize(2),
		"WithCooldown":      WithCooldown(time.Second, 2*time.Second),
		"WithProcess":       WithProcess(NewProcess()),
		"WithTokenLeases":   WithTokenLeases(false),
	}
	for name, o := range redisOnly {
		_, err := NewLocal(PerSecond(10), WithMaxWait(time.Second), o)
		if err == nil || !strings.Contains(err.Error(), name+" is an option of a Redis limiter") || !strings.Contains(err.Error(), "use NewRedis") {
			t.Errorf("NewLocal with %s: %v, want an error naming it", name, err)
		}
		if _, err := newRedis(PerSecond(10), time.Now, WithMaxWait(time.Second), o); err != nil {
			t.Errorf("a Redis limiter with %s: %v", name, err)
		}
	}
	both := []Option{WithObserver(nil), WithMaxWait(time.Second), WithMaxHold(time.Minute), WithLease(time.Second), WithDryRun(), WithHorizon(ClassBatch, time.Minute)}
	if _, err := NewLocal(PerSecond(10), both...); err != nil {
		t.Errorf("NewLocal with the options of both limiters: %v", err)
	}
}
