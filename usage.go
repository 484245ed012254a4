package pace

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// A Settler reads what a response cost, once its body has ended: from its
// headers, or from the first and last bytes of its body. It returns the
// actual costs under the limits it knows of (any other limit is settled at
// 1, as in a Wait), or false when the response does not say, and the
// reservation then keeps its estimate. It must not keep the slices of ends.
type Settler func(resp *http.Response, ends BodyEnds) (Costs, bool)

// BodyEnds are the first and the last bytes of a response body, as a
// Transport kept them for its Settler: up to BodyEndSize each (all of a
// shorter body is in both).
type BodyEnds struct {
	Head, Tail []byte
	// Complete says the body was read to its end: to its EOF, or, closed
	// before the EOF was read (as by a client that decodes JSON and
	// closes, which over HTTP/2 never reads the EOF), as far as its
	// Content-Length, or through one whole JSON object or array. False
	// when it was closed before, as by a client that stopped reading a
	// stream; a stream's Settler may still find its final event there.
	Complete bool
}

// BodyEndSize is how many bytes of each end of a response body a Transport
// keeps for its Settler.
const BodyEndSize = 8 << 10

// OpenAIUsage returns a Settler for OpenAI-compatible APIs: the total
// tokens of the response's usage object, under the limit named tokens. It
// reads chat/completions and completions (prompt_tokens, completion_tokens,
// total_tokens) and the Responses API (input_tokens, output_tokens), whole
// or streamed (the chunk that stream_options.include_usage adds before
// [DONE], or the response.completed event): a stream closed once [DONE]
// or response.completed came settles, though its EOF was never read. A
// stream cut short has no usage: its reservation keeps its estimate.
func OpenAIUsage(tokens string) Settler {
	return func(_ *http.Response, ends BodyEnds) (Costs, bool) {
		u, ok := lastUsage(ends.Tail)
		if !ok || !ended(ends, "[DONE]", `"response.completed"`) {
			return nil, false
		}
		switch {
		case u.TotalTokens != nil:
			return Costs{tokens: *u.TotalTokens}, true
		case u.PromptTokens != nil || u.CompletionTokens != nil:
			return Costs{tokens: value(u.PromptTokens) + value(u.CompletionTokens)}, true
		case u.InputTokens != nil || u.OutputTokens != nil:
			return Costs{tokens: value(u.InputTokens) + value(u.OutputTokens)}, true
		}
		return nil, false
	}
}

// AnthropicUsage returns a Settler for Anthropic's Messages API, whole or
// streamed: the input tokens (with those written to the prompt cache, which
// count as input; those read from it do not) under the limit named input,
// and the output tokens under the limit named output. An empty name leaves
// that limit out. A stream gives its input tokens in message_start, at its
// head, and its output tokens in its last message_delta; one closed once
// message_stop came settles, though its EOF was never read; a stream cut
// short keeps its estimate.
func AnthropicUsage(input, output string) Settler {
	return func(_ *http.Response, ends BodyEnds) (Costs, bool) {
		last, ok := lastUsage(ends.Tail)
		if !ok || !ended(ends, "message_stop") || last.OutputTokens == nil {
			return nil, false
		}
		in := last
		if in.InputTokens == nil { // a stream's final delta: the input is at its start
			if in, ok = firstUsage(ends.Head); !ok || in.InputTokens == nil {
				return nil, false
			}
		}
		costs := Costs{}
		if input != "" {
			costs[input] = *in.InputTokens + value(in.CacheCreationInputTokens)
		}
		if output != "" {
			costs[output] = *last.OutputTokens
		}
		return costs, true
	}
}

// HeaderCost returns a Settler that reads the actual cost under the limit
// named limit from a response header holding a whole number, such as
// Mistral's x-ratelimit-tokens-query-cost.
func HeaderCost(header, limit string) Settler {
	return func(resp *http.Response, _ BodyEnds) (Costs, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get(header)))
		if err != nil || n < 0 || n > maxUsage {
			return nil, false
		}
		return Costs{limit: n}, true
	}
}

// ended reports whether a body ended: it was Complete, or its tail holds
// one of the markers of a stream's final event.
func ended(ends BodyEnds, finals ...string) bool {
	for _, final := range finals {
		if bytes.Contains(ends.Tail, []byte(final)) {
			return true
		}
	}
	return ends.Complete
}

// usage is the usage object of an LLM API's response, in the forms of
// OpenAI's chat/completions, OpenAI's Responses API and Anthropic's
// Messages API. A field the object lacks is nil.
type usage struct {
	PromptTokens             *int `json:"prompt_tokens"`
	CompletionTokens         *int `json:"completion_tokens"`
	TotalTokens              *int `json:"total_tokens"`
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

// maxUsage bounds the counts a settler believes: anything larger, or
// negative, is garbage.
const maxUsage = 1 << 40

// valid reports whether every count of u is a plausible number of tokens.
func (u usage) valid() bool {
	for _, n := range []*int{u.PromptTokens, u.CompletionTokens, u.TotalTokens, u.InputTokens, u.OutputTokens, u.CacheCreationInputTokens} {
		if n != nil && (*n < 0 || *n > maxUsage) {
			return false
		}
	}
	return true
}

func value(n *int) int {
	if n == nil {
		return 0
	}
	return *n
}

// usageKey is what precedes a usage object in JSON.
var usageKey = []byte(`"usage"`)

// lastUsage returns the last usage object in b that parses (a body's tail
// may begin in the middle of one): `"usage": null` and objects cut short are
// passed over.
func lastUsage(b []byte) (usage, bool) {
	for end := len(b); end > 0; {
		i := bytes.LastIndex(b[:end], usageKey)
		if i < 0 {
			return usage{}, false
		}
		if u, ok := usageAt(b, i); ok {
			return u, true
		}
		end = i
	}
	return usage{}, false
}

// firstUsage returns the first usage object in b that parses.
func firstUsage(b []byte) (usage, bool) {
	for start := 0; start < len(b); {
		i := bytes.Index(b[start:], usageKey)
		if i < 0 {
			return usage{}, false
		}
		if u, ok := usageAt(b, start+i); ok {
			return u, true
		}
		start += i + len(usageKey)
	}
	return usage{}, false
}

// usageAt parses the usage object whose key begins at b[i]. A key inside a
// JSON string is escaped (\"usage\"), and passed over.
func usageAt(b []byte, i int) (usage, bool) {
	if i > 0 && b[i-1] == '\\' {
		return usage{}, false
	}
	rest := bytes.TrimLeft(b[i+len(usageKey):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return usage{}, false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return usage{}, false
	}
	var u usage
	if err := json.NewDecoder(bytes.NewReader(rest)).Decode(&u); err != nil || !u.valid() {
		return usage{}, false
	}
	return u, true
}
