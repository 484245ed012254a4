package pace

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestAllow, on Local and Redis at 10/s burst 2: two go now, the next two
// do not and book nothing (210 ms later one goes: the bucket's refill, an
// interval late on Redis after its burst, not a place behind bookings of
// theirs); a bad cost is an error.
func TestAllow(t *testing.T) {
	ctx := context.Background()
	for name, l := range map[string]interface {
		Allow(context.Context, string, int) (bool, error)
	}{
		"local": mustLocal(t, mustParseLimit(t, "10/s burst 2")),
		"redis": mustRedis(t, scriptRedis(t), mustParseLimit(t, "10/s burst 2"), WithFleetSize(1), sharedOnly, WithPrefix("allow-"+time.Now().Format("150405.000000")+":")),
	} {
		var got []bool
		for range 4 {
			ok, err := l.Allow(ctx, "k", 1)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got = append(got, ok)
		}
		time.Sleep(210 * time.Millisecond)
		ok, err := l.Allow(ctx, "k", 1)
		if want := []bool{true, true, false, false}; !slices.Equal(got, want) || !ok || err != nil {
			t.Errorf("%s: Allow gave %v, then after 210 ms %v, %v; want %v, then true", name, got, ok, err, want)
		}
		if ok, err := l.Allow(ctx, "k", 0); ok || err == nil {
			t.Errorf("%s: Allow of cost 0: %v, %v; want an error", name, ok, err)
		}
	}
}
