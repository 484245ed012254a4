package pace

import (
	"encoding/json"
	"io"
	"net/http"
)

// MaxEstimatedBody is how much of an LLM request's body an estimate reads
// (OpenAIEstimate, AnthropicEstimate, pace serve's costs): a longer body
// is estimated from its length alone.
const MaxEstimatedBody = 1 << 20

// RequestTokens estimates an LLM request's tokens from its body, of which
// head is the start (the whole body when it is no longer than
// MaxEstimatedBody) and size the length (-1 when unknown): prompt, a token
// for each four bytes and one more (JSON's own bytes make it high, and the
// settlement gives the difference back); out, the most the body asks the
// answer for (max_completion_tokens, max_tokens or max_output_tokens),
// else otherwise.
func RequestTokens(head []byte, size int64, otherwise int) (prompt, out int) {
	size = max(size, int64(len(head)))
	prompt, out = int(min(size/4+1, 1<<30)), otherwise
	if len(head) > MaxEstimatedBody || int64(len(head)) < size {
		return prompt, out // a start of JSON does not parse: its length says it all
	}
	var asked struct {
		MaxTokens           int `json:"max_tokens"`
		MaxCompletionTokens int `json:"max_completion_tokens"`
		MaxOutputTokens     int `json:"max_output_tokens"`
	}
	if json.Unmarshal(head, &asked) != nil {
		return prompt, out
	}
	for _, n := range []int{asked.MaxCompletionTokens, asked.MaxTokens, asked.MaxOutputTokens} {
		if n > 0 {
			return prompt, min(n, 1<<30)
		}
	}
	return prompt, out
}

// OpenAIEstimate returns an Estimate for OpenAI-compatible APIs, whose
// tokens-per-minute limit counts a request's prompt and the most it may
// answer with: under the limit named tokens, RequestTokens of the request's
// body (read through GetBody, MaxEstimatedBody at most, the request left as
// it is), its max tokens else otherwise. With OpenAIUsage as the Settler,
// the answer's usage settles it.
func OpenAIEstimate(tokens string, otherwise int) func(*http.Request) Costs {
	return func(req *http.Request) Costs {
		prompt, out := bodyTokens(req, otherwise)
		return Costs{tokens: prompt + out}
	}
}

// AnthropicEstimate returns an Estimate for Anthropic's Messages API, whose
// input and output tokens per minute are limits of their own: the
// prompt under the limit named input, the most it may answer with under
// the one named output (an empty name leaves that limit out), as
// OpenAIEstimate reads them. With AnthropicUsage as the Settler, the
// answer's usage settles it.
func AnthropicEstimate(input, output string, otherwise int) func(*http.Request) Costs {
	return func(req *http.Request) Costs {
		prompt, out := bodyTokens(req, otherwise)
		costs := Costs{}
		if input != "" {
			costs[input] = prompt
		}
		if output != "" {
			costs[output] = out
		}
		return costs
	}
}

// bodyTokens is RequestTokens of req's body, read through GetBody: of its
// length alone when it has no GetBody, or says it is longer than
// MaxEstimatedBody.
func bodyTokens(req *http.Request, otherwise int) (prompt, out int) {
	if req.Body == nil || req.Body == http.NoBody || req.GetBody == nil || req.ContentLength > MaxEstimatedBody {
		return RequestTokens(nil, req.ContentLength, otherwise)
	}
	body, err := req.GetBody()
	if err != nil {
		return RequestTokens(nil, req.ContentLength, otherwise)
	}
	defer body.Close()
	head, _ := io.ReadAll(io.LimitReader(body, MaxEstimatedBody+1))
	return RequestTokens(head, req.ContentLength, otherwise)
}
