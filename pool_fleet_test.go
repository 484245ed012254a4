package pace

import (
	"context"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/quotaapi"
)

// startPoolAPI starts a quotaapi.Pool of the test credentials named
// (poolSecret), each held to 100/s burst 5.
func startPoolAPI(t *testing.T, names []string) *quotaapi.Pool {
	var tokens []string
	for _, name := range names {
		tokens = append(tokens, poolSecret(name))
	}
	api, err := quotaapi.StartPool(quotaapi.Config{Rate: 100, Burst: 5}, tokens...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	return api
}

// secrets are the poolSecrets of the names.
func secrets(names ...string) []string {
	var out []string
	for _, name := range names {
		out = append(out, poolSecret(name))
	}
	return out
}

// runPoolFleet runs 4 processes of 8 goroutines each that send to url
// through a Transport with a Pool of names at 100/s burst 5 each, on c's
// Redis at addr, from start for length.
func runPoolFleet(t *testing.T, addr, url string, names []string, start time.Time, length time.Duration) {
	reports, _ := runFleet(t, 4, fleetWorker{
		Addr: addr, Limit: "100/s burst 5", Key: "pool", URL: url, Pool: names, WarmUp: true,
		Goroutines: 8, Start: start, End: start.Add(length),
	})
	checkNoErrors(t, reports)
}

// TestPoolFleet: three credentials, each held strictly to 100/s burst 5
// by the upstream (429 beyond); 4 processes of 8 goroutines each send
// through a Transport with the three in a Pool, on one Redis.
//   - For 8 s: the upstream serves at least 97% of 3 x (5 + 100 t), and
//     its quotas refuse at most 0.5% of the requests.
//   - For 7 s, B answering every request from 1 s to 6 s with a 429 and
//     Retry-After: 5: A and C carry at least 95% of 2 x 100/s meanwhile,
//     and B sees few requests (its first 429 holds it for the fleet).
//
// Its fleet sends 300 requests a second: it runs alone, not beside
// others (see besideOthers).
func TestPoolFleet(t *testing.T) {
	c := newTestRedis(t)
	names := []string{"A", "B", "C"}
	// Load the pool's script, so that the workers' EVALSHA finds it.
	warm := mustRedis(t, c, mustParseLimit(t, "100/s burst 5"), WithFleetSize(1))
	if _, _, err := warm.admit(context.Background(), target{key: "{warm-up}A", pool: []string{"{warm-up}A", "{warm-up}B"}}, 1); err != nil {
		t.Fatal(err)
	}

	start := time.Now().Add(time.Second) // time for the processes to start
	api := startPoolAPI(t, names)
	const length = 8 * time.Second
	runPoolFleet(t, c.Options().Addr, api.URL(), names, start, length)
	ok, refused := api.Served(start, start.Add(length), secrets(names...)...)
	bound := 3 * (5 + 100*length.Seconds())
	t.Logf("%v: %d served (%.1f%% of 3 x (b + r t) = %.0f), %d refused (%.2f%%)", length, ok, 100*float64(ok)/bound, bound, refused, 100*float64(refused)/float64(ok+refused))
	if float64(ok) < 0.97*bound {
		t.Errorf("%d served in %v, want 97%% of 3 x (b + r t) = %.0f at least", ok, length, 0.97*bound)
	}
	if float64(refused) > 0.005*float64(ok+refused) {
		t.Errorf("the quotas refused %d of %d requests, want 0.5%% at most", refused, ok+refused)
	}

	start = time.Now().Add(time.Second)
	api = startPoolAPI(t, names)
	from, until := start.Add(time.Second), start.Add(6*time.Second)
	api.Refuse(poolSecret("B"), from, until, "5")
	runPoolFleet(t, c.Options().Addr, api.URL(), names, start, 7*time.Second)
	found, err := api.CheckCarried(from, until, 100, secrets("A", "C")...)
	t.Log(found)
	if err != nil {
		t.Error(err)
	}
}
