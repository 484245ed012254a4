package outage

import (
	"errors"
	"testing"
	"time"
)

var errConnRefused = errors.New("dial tcp: connection refused")

// TestFailoverCooldowns: the cool-down doubles with each failed probe, with
// jitter of ±20%, up to the cap; one probe goes at a time; a successful
// probe brings Redis back.
func TestFailoverCooldowns(t *testing.T) {
	f := New(Config[*int]{MinCooldown: 100 * time.Millisecond, MaxCooldown: time.Second})
	now := time.Unix(1_700_000_000, 0)
	if r, _, _ := f.Route(now); r != ViaRedis {
		t.Fatalf("a new failover routes %v, want ViaRedis", r)
	}
	if began, _, _ := f.Fail(now, Failure{Began: now, Failures: ConfirmRow, Err: errConnRefused}, time.Second); !began {
		t.Fatal("the first failure did not begin an outage")
	}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		cooldown := f.retryAt.Sub(now)
		if cooldown < want*8/10 || cooldown > min(want*12/10, time.Second) {
			t.Fatalf("cool-down %d = %v, want %v ± 20%%, at most 1s", i, cooldown, want)
		}
		if r, _, cause := f.Route(now.Add(cooldown - time.Millisecond)); r != WithoutRedis || cause != errConnRefused {
			t.Fatalf("during cool-down %d: route %v (cause %v), want WithoutRedis for %v", i, r, cause, errConnRefused)
		}
		now = now.Add(cooldown)
		if r, _, _ := f.Route(now); r != ViaProbe {
			t.Fatalf("after cool-down %d: route %v, want ViaProbe", i, r)
		}
		if r, _, _ := f.Route(now); r != WithoutRedis {
			t.Fatalf("during the probe: route %v, want WithoutRedis (one probe at a time)", r)
		}
		if began, _, _ := f.Fail(now, Failure{Began: now, Probe: true, Failures: 1, Err: errConnRefused}, time.Second); began {
			t.Fatal("a failed probe began a new outage")
		}
	}
	now = f.retryAt
	f.Route(now) // the probe
	if outage := f.Recover(now, time.Second); outage <= 0 {
		t.Errorf("recover reported an outage of %v", outage)
	}
	if r, _, _ := f.Route(now); r != ViaRedis || f.Mode() != Shared {
		t.Errorf("after recovery under a policy that does not pace locally: route %v, mode %v; want ViaRedis, shared (nothing to gate)", r, f.Mode())
	}
}

// TestFailoverReleasesItsLocal: each local limiter NewLocal returned is
// released once, when its outage's return ends, when a new outage begins
// before, or when the failover is closed.
func TestFailoverReleasesItsLocal(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	made, released := 0, map[*int]int{}
	f := New(Config[*int]{PacesLocally: true, MinCooldown: time.Millisecond, MaxCooldown: time.Millisecond,
		NewLocal: func(time.Time, map[string]time.Time) *int { made++; return new(int) },
		Release:  func(l *int) { released[l]++ }})
	fail := func() { f.Fail(now, Failure{Began: now, Failures: ConfirmRow, Err: errConnRefused}, time.Second) }
	fail()
	_, first, _ := f.Route(now)
	fail() // a new outage while the first lasts: no new local
	now = now.Add(time.Second)
	f.Route(now) // the probe
	f.Recover(now, time.Millisecond)
	f.Route(now.Add(time.Second)) // the return ends
	if made != 1 || released[first] != 1 {
		t.Fatalf("%d locals made, the first released %d times; want 1 and 1", made, released[first])
	}
	now = now.Add(2 * time.Second)
	fail()
	_, second, _ := f.Route(now)
	f.Close()
	f.Close()
	now = now.Add(time.Second)
	f.Route(now)
	f.Recover(now, time.Millisecond)
	f.Route(now.Add(time.Second))
	if made != 2 || released[second] != 1 {
		t.Errorf("%d locals made, the second released %d times; want 2 and 1 (closed, then its return ended)", made, released[second])
	}
}
