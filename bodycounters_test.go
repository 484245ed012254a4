package pace

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/usage"
)

// TestShopifyCounters: the bucket of a THROTTLED answer, as the reading
// that steers the key: what is left (whole points), the time until full,
// the window of the whole bucket, a quota that refills; and nothing from a
// body that states none.
func TestShopifyCounters(t *testing.T) {
	body := `{"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}], "extensions": {"cost": {"requestedQueryCost": 752, "actualQueryCost": null, ` +
		`"throttleStatus": {"maximumAvailable": 2000.0, "currentlyAvailable": 542.5, "restoreRate": 100.0}}}}`
	readings := ShopifyCounters(nil, usage.Ends{Head: []byte(body), Tail: []byte(body), Complete: true})
	if len(readings) != 1 {
		t.Fatalf("%d readings, want 1", len(readings))
	}
	r := readings[0]
	if r.Name != "cost" || r.Limit != 2000 || r.Remaining != 542 || !r.Refills || r.Window != 20*time.Second || r.Reset != 14575*time.Millisecond || !strings.Contains(r.Header, "THROTTLED") {
		t.Errorf("reading %+v", r)
	}
	if readings := ShopifyCounters(nil, usage.Ends{Head: []byte(`{"data": {}}`), Tail: []byte(`{"data": {}}`)}); readings != nil {
		t.Errorf("a body without a bucket: %+v", readings)
	}
}
