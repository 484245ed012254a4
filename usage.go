package pace

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/fleetpace/pace/usage"
)

// A Settler reads what a response cost, once its body has ended: from its
// headers, or from the first and last bytes of its body. It returns the
// actual costs under the limits it knows of (any other limit is settled at
// 1, as in a Wait), or false when the response does not say, and the
// reservation then keeps its estimate. ends are the body's first and last
// bytes, as the Transport kept them: up to BodyEndSize each (all of a
// shorter body is in both), and whether the body was read to its end. It
// must not keep their slices.
type Settler func(resp *http.Response, ends usage.Ends) (Costs, bool)

// BodyEndSize is how many bytes of each end of a response body a Transport
// keeps for its Settler.
const BodyEndSize = 8 << 10

// OpenAIUsage returns a Settler for OpenAI-compatible APIs: the total
// tokens of the response's usage object (see usage.OpenAI), under the
// limit named tokens. A stream cut short has no usage: its reservation
// keeps its estimate.
func OpenAIUsage(tokens string) Settler {
	return func(_ *http.Response, ends usage.Ends) (Costs, bool) {
		n, ok := usage.OpenAI(ends)
		if !ok {
			return nil, false
		}
		return Costs{tokens: n}, true
	}
}

// AnthropicUsage returns a Settler for Anthropic's Messages API, whole or
// streamed (see usage.Anthropic): the input tokens under the limit named
// input, and the output tokens under the limit named output. An empty
// name leaves that limit out. A stream cut short keeps its estimate.
func AnthropicUsage(input, output string) Settler {
	return func(_ *http.Response, ends usage.Ends) (Costs, bool) {
		in, out, ok := usage.Anthropic(ends)
		if !ok {
			return nil, false
		}
		costs := Costs{}
		if input != "" {
			costs[input] = in
		}
		if output != "" {
			costs[output] = out
		}
		return costs, true
	}
}

// HeaderCost returns a Settler that reads the actual cost under the limit
// named limit from a response header holding a whole number, such as
// Mistral's x-ratelimit-tokens-query-cost.
func HeaderCost(header, limit string) Settler {
	return func(resp *http.Response, _ usage.Ends) (Costs, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get(header)))
		if err != nil || n < 0 || n > usage.MaxCount {
			return nil, false
		}
		return Costs{limit: n}, true
	}
}
