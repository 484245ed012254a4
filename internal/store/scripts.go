package store

import (
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxDelay is the longest wait a script books: pace.MaxDelay.
const MaxDelay = 100 * 365 * 24 * time.Hour

// MaxRefill (a year) is the longest time a bucket may take to refill from empty.
// It keeps every time the Redis script handles an exact integer in Lua's
// doubles, with a wide margin.
const MaxRefill = 365 * 24 * time.Hour

// Horizon is the furthest ahead of Redis's clock that a time pace writes
// can lie: the longest wait it books and the longest refill. The scripts
// take anything further for foreign data.
const Horizon = MaxDelay + MaxRefill

var (
	//go:embed lua/common.lua
	commonSource string
	//go:embed lua/reserve.lua
	reserveSource string
	//go:embed lua/quota.lua
	quotaSource string
	//go:embed lua/booking.lua
	bookingSource string
	//go:embed lua/refund.lua
	refundSource string
	//go:embed lua/hold.lua
	holdSource string
	//go:embed lua/held.lua
	heldSource string
	//go:embed lua/settle.lua
	settleSource string
	//go:embed lua/sync.lua
	syncSource string
	//go:embed lua/slots.lua
	slotsSource string
	//go:embed lua/line.lua
	lineSource string
	//go:embed lua/record.lua
	recordSource string
	//go:embed lua/rate.lua
	rateSource string
	//go:embed lua/refused.lua
	refusedSource string
	//go:embed lua/repay.lua
	repaySource string
	//go:embed lua/check.lua
	checkSource string

	reserveScript = newScript(rateSource, recordSource, reserveSource)
	quotaScript   = newScript(rateSource, recordSource, quotaSource)
	refusedScript = newScript(rateSource, refusedSource)
	refundScript  = newScript(bookingSource, refundSource)
	holdScript    = newScript(holdSource)
	heldScript    = newScript(heldSource)
	settleScript  = newScript(bookingSource, settleSource)
	syncScript    = newScript(syncSource)
	slotsScript   = newScript(slotsSource)
	lineScript    = newScript(lineSource)
	repayScript   = newScript(repaySource)
	checkScript   = newScript(checkSource)
)

// newScript is a script of parts, after the common prelude.
func newScript(parts ...string) *redis.Script {
	prelude := fmt.Sprintf("local horizon = %d\nlocal max_refill = %d\n", Horizon.Microseconds(), MaxRefill.Microseconds())
	return redis.NewScript(prelude + commonSource + strings.Join(parts, ""))
}

// maxDelayArg is MaxDelay as a script argument, boxed once.
var maxDelayArg any = MaxDelay.Microseconds()
