package pace

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/usage"
)

// TestShopifyCounters: the bucket of a THROTTLED answer, as the reading
// that steers the key: what is left (whole points), the time until full,
// the window of the whole bucket, a quota that refills, and the refusal;
// an answer with data is none; and nothing from a body that states none.
func TestShopifyCounters(t *testing.T) {
	body := `{"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}], "extensions": {"cost": {"requestedQueryCost": 752, "actualQueryCost": null, ` +
		`"throttleStatus": {"maximumAvailable": 2000.0, "currentlyAvailable": 542.5, "restoreRate": 100.0}}}}`
	readings := ShopifyCounters(nil, usage.Ends{Head: []byte(body), Tail: []byte(body), Complete: true})
	if len(readings) != 1 {
		t.Fatalf("%d readings, want 1", len(readings))
	}
	r := readings[0]
	if r.Name != "cost" || r.Limit != 2000 || r.Remaining != 542 || !r.Refills || r.Window != 20*time.Second || r.Reset != 14575*time.Millisecond || !strings.Contains(r.Header, "THROTTLED") || !r.Refused {
		t.Errorf("reading %+v", r)
	}
	served := `{"data": {"shop": {"name": "x"}}, "extensions": {"cost": {"requestedQueryCost": 2, "actualQueryCost": 2, "throttleStatus": {"maximumAvailable": 1000.0, "currentlyAvailable": 998, "restoreRate": 50.0}}}}`
	if readings := ShopifyCounters(nil, usage.Ends{Head: []byte(served), Tail: []byte(served), Complete: true}); len(readings) != 1 || readings[0].Refused {
		t.Errorf("an answer with data: %+v, want one reading, not refused", readings)
	}
	if readings := ShopifyCounters(nil, usage.Ends{Head: []byte(`{"data": {}}`), Tail: []byte(`{"data": {}}`)}); readings != nil {
		t.Errorf("a body without a bucket: %+v", readings)
	}
}

// TestThrottledSteersTheRate: THROTTLED answers (200s) of a bucket that
// restores slower than pace's limit say the fleet outran it, as 429s do:
// once a round of them is weighed, the key's rate is cut. They were taken
// for refusals the reading explains, and 2x too fast a fleet was refused
// again at each refill (in the simulator, 516 of about 2,000 requests after
// the first second at 400/s under pace at 800/s; none now).
func TestThrottledSteersTheRate(t *testing.T) {
	throttled := `{"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}], "extensions": {"cost": {"requestedQueryCost": 1, "actualQueryCost": null, ` +
		`"throttleStatus": {"maximumAvailable": 10.0, "currentlyAvailable": 0, "restoreRate": 50.0}}}}`
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, throttled)
	}))
	t.Cleanup(api.Close)
	log := &eventLog{}
	client := &http.Client{Transport: &Transport{Limiter: mustLocal(t, PerSecond(100).WithBurst(1), WithObserver(log.observe)), BodyCounters: ShopifyCounters}}
	for sent := 0; sent < 20 && log.count(EventRate) == 0; sent++ {
		resp, err := client.Get(api.URL)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if log.count(EventRate) == 0 {
		t.Error("20 THROTTLED answers in a row at 100/s did not cut the key's rate")
	}
}
