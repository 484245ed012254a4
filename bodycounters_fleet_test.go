package pace

import (
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/quotaapi"
	"github.com/fleetpace/pace/internal/redistest"
)

// TestShopifyFleet: an upstream that states its bucket in its bodies as
// Shopify's GraphQL Admin API does (1000 points, 50 restored a second,
// each query 2, THROTTLED in a 200) and a fleet of 2 processes of 4
// goroutines that reads it (ShopifyCounters), configured at the bucket
// exactly: PerSecond(50).WithBurst(1000). Full at the start (the
// configuration right), and with 900 points spent by another client just
// before (the fleet believes the bucket full), the fleet is never
// THROTTLED and spends 95% or more of what the bucket had and restored.
func TestShopifyFleet(t *testing.T) {
	besideOthers(t)
	srv := redistest.Start(t)
	warmScript(t, srv)
	const cost, run = 2, 5 * time.Second
	for _, spent := range []int{0, 900} {
		api := startQuotaAPI(t, quotaapi.Config{Dialect: quotaapi.Shopify, Rate: 50, Burst: 1000, Cost: cost})
		start := time.Now().Add(1500 * time.Millisecond)
		runFleet(t, 2, fleetWorker{
			Addr: srv.Addr, Limit: "50/s burst 1000", Key: "shop", Goroutines: 4, URL: api.URL(), ShopifyCost: cost,
			Start: start, End: start.Add(run),
		}, fault{at: -200 * time.Millisecond, act: func() { api.Spend(spent) }})
		arrivals := api.Arrivals()
		logSeconds(t, arrivals, start, start.Add(run))
		level, last := 1000.0, start // what the bucket had at start, and the fleet's last arrival
		for _, a := range arrivals {
			if a.Foreign {
				level = min(float64(a.Left)+50*start.Sub(a.At).Seconds(), 1000)
			} else {
				last = a.At
			}
		}
		fleet := tallyOf(arrivals, start.Add(-time.Second), last.Add(time.Nanosecond))
		budget := level + 50*last.Sub(start).Seconds()
		t.Logf("%d spent before: the fleet spent %d points of the %.0f the bucket had and restored (%.1f%%), %d THROTTLED",
			spent, fleet.ok*cost, budget, 100*float64(fleet.ok*cost)/budget, fleet.refused)
		if fleet.refused > 0 {
			t.Errorf("%d spent before: %d THROTTLED answers, want none", spent, fleet.refused)
		}
		if float64(fleet.ok*cost) < 0.95*budget {
			t.Errorf("%d spent before: the fleet spent %d points, less than 95%% of %.0f", spent, fleet.ok*cost, budget)
		}
	}
}
