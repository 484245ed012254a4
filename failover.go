package pace

import (
	"errors"
	"fmt"
)

// A FailurePolicy says what a Redis limiter does while Redis fails.
type FailurePolicy uint8

const (
	// FallbackLocal paces each key in this process at its share of the
	// limit: the rate and burst divided by the fleet's size. It is the default.
	FallbackLocal FailurePolicy = iota
	// FailOpen lets every request through at once, unpaced.
	FailOpen
	// FailClosed fails every request with an error that wraps ErrUnavailable.
	FailClosed
)

// String returns the policy's name, such as "FallbackLocal".
func (p FailurePolicy) String() string {
	switch p {
	case FallbackLocal:
		return "FallbackLocal"
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", uint8(p))
}

// ErrUnavailable is wrapped by the errors of a FailClosed limiter while Redis
// fails.
var ErrUnavailable = errors.New("pace: Redis unavailable")
