// Package usage reads the usage objects that LLM APIs put in their
// response bodies, whole or streamed: OpenAI's chat/completions,
// completions and Responses API, and Anthropic's Messages API. It reads a
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

// at parses the usage object whose key begins at b[i]. A key inside a JSON
// string is escaped (\"usage\"), and passed over.
func at(b []byte, i int) (object, bool) {
	if i > 0 && b[i-1] == '\\' {
		return object{}, false
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return object{}, false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return object{}, false
	}
	var u object
	if err := json.NewDecoder(bytes.NewReader(rest)).Decode(&u); err != nil || !u.valid() {
		return object{}, false
	}
	return u, true
}
