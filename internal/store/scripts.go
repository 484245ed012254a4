package store

import (
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace/lua"
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
	reserveScript    = newScript("rate", "record", "limits", "reserve")
	quotaScript      = newScript("rate", "record", "quota")
	refusedScript    = newScript("rate", "refused")
	refundScript     = newScript("booking", "refund")
	holdScript       = newScript("hold")
	heldScript       = newScript("held")
	settleScript     = newScript("booking", "settle")
	syncScript       = newScript("sync")
	slotsScript      = newScript("slot", "slots")
	releaseScript    = &script{eval: redis.NewScript(part("release"))} // no prelude: see lua/release.lua
	lineScript       = newScript("line")
	repayScript      = newScript("repay")
	checkScript      = newScript("check")
	announceScript   = newScript("limits", "announce")
	tokenLeaseScript = newScript("limits", "tokenlease")

	// The booking scripts that take a slot of a cap with the booking.
	reserveTakeScript = newTakeScript("reserve")
	quotaTakeScript   = newTakeScript("quota")

	// The booking scripts that book on one of a pool's keys.
	reservePickScript = newPickScript("reserve")
	quotaPickScript   = newPickScript("quota")
)

// newScript is the script of the parts named (lua/NAME.lua), after the
// constants the scripts share and the common prelude: the last is its body,
// the others helpers (see newFunction).
func newScript(parts ...string) *script {
	last := len(parts) - 1
	return newFunction(parts[last], joined(append([]string{"common"}, parts[:last]...)...), part(parts[last]))
}

// newTakeScript is the booking script body (reserve or quota) that takes a
// slot of a cap with its booking: lua/take.lua before it, and the body run
// as a function whose reply take.lua's slot_taken completes.
func newTakeScript(body string) *script {
	return &script{eval: redis.NewScript(scriptText("rate", "record", "limits", "slot", "take") +
		"return slot_taken((function()\n" + part(body) + "\nend)())\n")}
}

// newPickScript is the booking script body (reserve or quota), with its
// prelude, as a function decide(KEYS, ARGV), which lua/pick.lua, after it,
// runs for each key of a pool: the prelude's helpers read the keys of the
// candidate asked.
func newPickScript(body string) *script {
	return &script{eval: redis.NewScript(constants() + "local function decide(KEYS, ARGV)\n" +
		joined("common", "rate", "record", "limits", body) + "\nend\n" + part("pick"))}
}

// scriptText is the text of the parts named, after the constants the
// scripts share and the common prelude.
func scriptText(parts ...string) string {
	return constants() + joined(append([]string{"common"}, parts...)...)
}

// constants are the lines that set what every script shares: horizon and
// max_refill.
func constants() string {
	return fmt.Sprintf("local horizon = %d\nlocal max_refill = %d\n", Horizon.Microseconds(), MaxRefill.Microseconds())
}

// joined is the text of the parts named, in turn.
func joined(names ...string) string {
	var b strings.Builder
	for _, name := range names {
		b.WriteString(part(name))
	}
	return b.String()
}

// part is the text of lua/NAME.lua.
func part(name string) string {
	source, err := lua.FS.ReadFile(name + ".lua")
	if err != nil {
		panic(err) // embedded: a missing part is a mistake of the build
	}
	return string(source)
}

// maxDelayArg is MaxDelay as a script argument, boxed once.
var maxDelayArg any = MaxDelay.Microseconds()
