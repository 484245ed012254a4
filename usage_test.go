package pace

import (
	"maps"
	"net/http"
	"strings"
	"testing"
)

// Samples of what the APIs send, whole and streamed.
const (
	openAIChat = `{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello! How can I assist you today?", "refusal": null, "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
  "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}},
  "service_tier": "default"
}`
	openAIStream = `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}

data: [DONE]

`
	openAIResponses       = `{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}`
	openAIResponsesStream = `event: response.created
data: {"type":"response.created","response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Hi"}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"completed","model":"gpt-4.1-2025-04-14","output":[],"usage":{"input_tokens":37,"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48},"user":null,"metadata":{}}}

`
	anthropicMessage     = `{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":100,"cache_read_input_tokens":1800,"output_tokens":503}}`
	anthropicStreamStart = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":0,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

`
	anthropicStreamDelta = `event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

`
	anthropicStreamEnd = `event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`
)

// endsOf returns the ends a Transport keeps of body, read whole.
func endsOf(body string, complete bool) BodyEnds {
	b := &endingBody{}
	b.keep([]byte(body))
	return BodyEnds{Head: b.head, Tail: b.tail[max(len(b.tail)-BodyEndSize, 0):], Complete: complete}
}

func TestSettlers(t *testing.T) {
	longStream := anthropicStreamStart + strings.Repeat(anthropicStreamDelta, 400) + anthropicStreamEnd // 40 KB: the usage at each end
	openAI, anthropic := OpenAIUsage("tokens"), AnthropicUsage("input", "output")
	for name, tc := range map[string]struct {
		settler Settler
		body    string
		cut     bool  // the body was closed before its end
		want    Costs // nil: no settlement, the estimate stands
	}{
		"OpenAI chat completion":              {openAI, openAIChat, false, Costs{"tokens": 29}},
		"OpenAI stream with include_usage":    {openAI, openAIStream, false, Costs{"tokens": 21}},
		"OpenAI stream without include_usage": {openAI, strings.Split(openAIStream, "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[],")[0], false, nil},
		"OpenAI stream cut short":             {openAI, openAIStream[:300], true, nil},
		"OpenAI stream closed after [DONE]":   {openAI, openAIStream, true, Costs{"tokens": 21}},
		"OpenAI stream closed before [DONE]":  {openAI, strings.TrimSuffix(openAIStream, "data: [DONE]\n\n"), true, nil},
		"OpenAI Responses API":                {openAI, openAIResponses, false, Costs{"tokens": 123}},
		"OpenAI Responses API stream":         {openAI, openAIResponsesStream, false, Costs{"tokens": 48}},
		"Anthropic message":                   {anthropic, anthropicMessage, false, Costs{"input": 2195, "output": 503}},
		"Anthropic stream":                    {anthropic, anthropicStreamStart + anthropicStreamDelta + anthropicStreamEnd, false, Costs{"input": 35, "output": 15}},
		"Anthropic stream of 40 KB":           {anthropic, longStream, false, Costs{"input": 35, "output": 15}},
		"Anthropic stream cut short":          {anthropic, anthropicStreamStart + anthropicStreamDelta, true, nil},
		"Anthropic stream closed after message_stop": {anthropic, anthropicStreamStart + anthropicStreamDelta + anthropicStreamEnd, true,
			Costs{"input": 35, "output": 15}},
		"Anthropic stream closed before message_stop":                 {anthropic, strings.Split(anthropicStreamStart+anthropicStreamDelta+anthropicStreamEnd, "event: message_stop")[0], true, nil},
		"OpenAI Responses API stream closed after response.completed": {openAI, openAIResponsesStream, true, Costs{"tokens": 48}},
		"Anthropic, output limit only":                                {AnthropicUsage("", "output"), anthropicMessage, false, Costs{"output": 503}},
		"an error page":                                               {openAI, `<html><body>502 Bad Gateway</body></html>`, false, nil},
		"an API error":                                                {anthropic, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, false, nil},
		"a usage quoted in the text": {openAI, `{"choices":[{"message":{"content":"say \"usage\": {\"total_tokens\": 999999}"}}],"usage":{"total_tokens":7}}`,
			false, Costs{"tokens": 7}},
		"a negative count":         {openAI, `{"usage":{"prompt_tokens":5,"completion_tokens":-90,"total_tokens":-85}}`, false, nil},
		"an enormous count":        {openAI, `{"usage":{"total_tokens":99999999999999999999}}`, false, nil},
		"a fractional count":       {openAI, `{"usage":{"total_tokens":12.5}}`, false, nil},
		"a usage that is a string": {openAI, `{"usage":"29"}`, false, nil},
		"no body":                  {openAI, ``, false, nil},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := tc.settler(&http.Response{Header: http.Header{}}, endsOf(tc.body, !tc.cut))
			if ok != (tc.want != nil) || !maps.Equal(got, tc.want) {
				t.Errorf("settled at %v (%v), want %v", got, ok, tc.want)
			}
		})
	}
}

func TestHeaderCost(t *testing.T) {
	settler := HeaderCost("X-Ratelimit-Tokens-Query-Cost", "tokens")
	for value, want := range map[string]Costs{"412": {"tokens": 412}, " 7 ": {"tokens": 7}, "0": {"tokens": 0}, "": nil, "-3": nil, "lots": nil, "1e9": nil, "99999999999999999999": nil} {
		resp := &http.Response{Header: http.Header{}}
		if value != "" {
			resp.Header.Set("X-Ratelimit-Tokens-Query-Cost", value)
		}
		if got, ok := settler(resp, BodyEnds{Complete: true}); ok != (want != nil) || !maps.Equal(got, want) {
			t.Errorf("header %q: settled at %v (%v), want %v", value, got, ok, want)
		}
	}
}

// FuzzSettlers: whatever the body's ends, the settlers never panic and never
// settle at a negative cost.
func FuzzSettlers(f *testing.F) {
	f.Add([]byte(anthropicStreamStart), []byte(anthropicStreamEnd), true)
	f.Add([]byte(openAIStream), []byte(openAIStream), true)
	f.Add([]byte(`{"usage":{`), []byte(`"usage":{"total_tokens":1}}`), false)
	settlers := []Settler{OpenAIUsage("tokens"), AnthropicUsage("input", "output"), HeaderCost("X-Cost", "tokens")}
	f.Fuzz(func(t *testing.T, head, tail []byte, complete bool) {
		resp := &http.Response{Header: http.Header{"X-Cost": {string(head)}}}
		for _, settle := range settlers {
			costs, ok := settle(resp, BodyEnds{Head: head, Tail: tail, Complete: complete})
			for name, n := range costs {
				if !ok || n < 0 {
					t.Fatalf("settled %v (%v): %q at %d", costs, ok, name, n)
				}
			}
		}
	})
}
