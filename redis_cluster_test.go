package pace

import (
	"context"
	"testing"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestOnCluster runs the checks of the distributed path on a real
// three-master Redis Cluster, with keys that hash to different slots: every
// key one decision touches shares its hash tag, so no CROSSSLOT error can
// arise.
func TestOnCluster(t *testing.T) {
	besideOthers(t)
	c := redistest.StartCluster(t).Client(t)
	for name, check := range map[string]func(*testing.T, redis.UniversalClient){
		"MatchesModel":         checkMatchesModel,
		"DeadlineBooksNothing": checkDeadlineBooksNothing,
		"CancelGivesBack":      checkCancelGivesBack,
		"QuotaMatchesModel":    checkQuotaMatchesModel,
		"AllOrNothing":         checkAllOrNothing,
		"KeysExpire":           checkKeysExpire,
		"PoolBooksOnce":        checkPoolBooksOnce,
		"TokenLeases": func(t *testing.T, c redis.UniversalClient) {
			checkLeasesServe(t, c, true)
		},
		"PoolChooses": func(t *testing.T, c redis.UniversalClient) {
			checkPoolChooses(t, mustRedis(t, c, mustParseLimit(t, "2/s burst 1"), WithFleetSize(1), sharedOnly))
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := c.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
				return node.FlushAll(ctx).Err()
			})
			if err != nil {
				t.Fatal(err)
			}
			check(t, c)
		})
	}
}
