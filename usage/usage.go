// Package usage reads the usage objects that LLM APIs put in their
// response bodies, whole or streamed: OpenAI's chat/completions,
// completions and Responses API, and Anthropic's Messages API; and the
// cost bucket Shopify's GraphQL Admin API states in its bodies. It reads a
// body's first and last bytes (what pace's Transport keeps of it, Ends),
// never panics, and believes no count below 0 or above MaxCount. Another
// vendor's format is one more function here.
package usage

import (
	"bytes"
	"encoding/json"
)

// Ends are the first and the last bytes of a response body (all of a short
// body is in both).
type Ends struct {
	Head, Tail []byte
	// Complete says the body was read to its end: to its EOF, or, closed
	// before the EOF was read (as by a client that decodes JSON and
	// closes, which over HTTP/2 never reads the EOF), as far as its
	// Content-Length, or through one whole JSON object or array. False
	// when it was closed before, as by a client that stopped reading a
	// stream; a stream's final event may still be in its Tail.
	Complete bool
}

// MaxCount bounds the counts believed: anything larger, or negative, is
// garbage.
const MaxCount = 1 << 40

// OpenAI returns the total tokens of the usage object of an
// OpenAI-compatible response: chat/completions and completions
// (prompt_tokens, completion_tokens, total_tokens) and the Responses API
// (input_tokens, output_tokens), whole or streamed (the chunk that
// stream_options.include_usage adds before [DONE], or the
// response.completed event). A stream closed once [DONE] or
// response.completed came counts, though its EOF was never read; one cut
// short, or a response without usage, gives false.
func OpenAI(ends Ends) (tokens int, ok bool) {
	u, ok := last(ends.Tail)
	if !ok || !ended(ends, "[DONE]", `"response.completed"`) {
		return 0, false
	}
	switch {
	case u.TotalTokens != nil:
		return *u.TotalTokens, true
	case u.PromptTokens != nil || u.CompletionTokens != nil:
		return value(u.PromptTokens) + value(u.CompletionTokens), true
	case u.InputTokens != nil || u.OutputTokens != nil:
		return value(u.InputTokens) + value(u.OutputTokens), true
	}
	return 0, false
}

// Anthropic returns the input tokens (with those written to the prompt
// cache, which count as input; those read from it do not) and the output
// tokens of a response of Anthropic's Messages API, whole or streamed. A
// stream gives its input tokens in message_start, at its head, and its
// output tokens in its last message_delta; one closed once message_stop
// came counts, though its EOF was never read; one cut short gives false.
func Anthropic(ends Ends) (input, output int, ok bool) {
	final, ok := last(ends.Tail)
	if !ok || !ended(ends, "message_stop") || final.OutputTokens == nil {
		return 0, 0, false
	}
	in := final
	if in.InputTokens == nil { // a stream's final delta: the input is at its start
		if in, ok = first(ends.Head); !ok || in.InputTokens == nil {
			return 0, 0, false
		}
	}
	return *in.InputTokens + value(in.CacheCreationInputTokens), *final.OutputTokens, true
}

// ended reports whether a body ended: it was Complete, or its tail holds
// one of the markers of a stream's final event.
func ended(ends Ends, finals ...string) bool {
	for _, final := range finals {
		if bytes.Contains(ends.Tail, []byte(final)) {
			return true
		}
	}
	return ends.Complete
}

// object is the usage object of an LLM API's response, in the forms of
// OpenAI's chat/completions, OpenAI's Responses API and Anthropic's
// Messages API. A field the object lacks is nil.
type object struct {
	PromptTokens             *int `json:"prompt_tokens"`
	CompletionTokens         *int `json:"completion_tokens"`
	TotalTokens              *int `json:"total_tokens"`
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

// valid reports whether every count of u is a plausible number of tokens.
func (u object) valid() bool {
	for _, n := range []*int{u.PromptTokens, u.CompletionTokens, u.TotalTokens, u.InputTokens, u.OutputTokens, u.CacheCreationInputTokens} {
		if n != nil && (*n < 0 || *n > MaxCount) {
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

// key is what precedes a usage object in JSON.
var key = []byte(`"usage"`)

// last returns the last usage object in b that parses (a body's tail may
// begin in the middle of one): `"usage": null` and objects cut short are
// passed over.
func last(b []byte) (object, bool) {
	for end := len(b); end > 0; {
		i := bytes.LastIndex(b[:end], key)
		if i < 0 {
			return object{}, false
		}
		if u, ok := at(b, i); ok {
			return u, true
		}
		end = i
	}
	return object{}, false
}

// first returns the first usage object in b that parses.
func first(b []byte) (object, bool) {
	for start := 0; start < len(b); {
		i := bytes.Index(b[start:], key)
		if i < 0 {
			return object{}, false
		}
		if u, ok := at(b, start+i); ok {
			return u, true
		}
		start += i + len(key)
	}
	return object{}, false
}

// at parses the usage object whose key begins at b[i].
func at(b []byte, i int) (object, bool) {
	var u object
	if !decodeAt(b, i, key, &u) || !u.valid() {
		return object{}, false
	}
	return u, true
}

// decodeAt decodes into v the object after the key name that begins at
// b[i]. A key inside a JSON string is escaped (\"usage\"), and passed over.
func decodeAt(b []byte, i int, name []byte, v any) bool {
	if i > 0 && b[i-1] == '\\' {
		return false
	}
	rest := bytes.TrimLeft(b[i+len(name):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return false
	}
	return json.NewDecoder(bytes.NewReader(rest)).Decode(v) == nil
}

// Throttle is the cost bucket that Shopify's GraphQL Admin API states in
// each response's extensions.cost.throttleStatus: a leaky bucket of Maximum
// points, Available now (after the query's cost), that restores
// RestoreRate points a second. Throttled says the query was refused
// (errors[].extensions.code "THROTTLED", in a 200).
type Throttle struct {
	Maximum, Available, RestoreRate float64
	Throttled                       bool
}

// Shopify returns the cost bucket a response of Shopify's GraphQL Admin API
// states: the last extensions.cost object of its tail whose throttleStatus
// is plausible (a maximum from 1 to MaxCount, available from 0 to the
// maximum, a restore rate above 0 and at most MaxCount a second: a small
// bucket may restore more than its size in a second).
func Shopify(ends Ends) (Throttle, bool) {
	var cost struct {
		ThrottleStatus *struct {
			MaximumAvailable   float64 `json:"maximumAvailable"`
			CurrentlyAvailable float64 `json:"currentlyAvailable"`
			RestoreRate        float64 `json:"restoreRate"`
		} `json:"throttleStatus"`
	}
	for end := len(ends.Tail); end > 0; {
		i := bytes.LastIndex(ends.Tail[:end], costKey)
		if i < 0 {
			return Throttle{}, false
		}
		end = i
		cost.ThrottleStatus = nil
		if !decodeAt(ends.Tail, i, costKey, &cost) || cost.ThrottleStatus == nil {
			continue
		}
		s := cost.ThrottleStatus
		if s.MaximumAvailable >= 1 && s.MaximumAvailable <= MaxCount && s.CurrentlyAvailable >= 0 &&
			s.CurrentlyAvailable <= s.MaximumAvailable && s.RestoreRate > 0 && s.RestoreRate <= MaxCount {
			throttled := bytes.Contains(ends.Head, throttledCode) || bytes.Contains(ends.Tail, throttledCode)
			return Throttle{Maximum: s.MaximumAvailable, Available: s.CurrentlyAvailable, RestoreRate: s.RestoreRate, Throttled: throttled}, true
		}
	}
	return Throttle{}, false
}

var (
	costKey       = []byte(`"cost"`)
	throttledCode = []byte(`"THROTTLED"`)
)
