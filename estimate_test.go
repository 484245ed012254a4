package pace

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEstimates: OpenAIEstimate and AnthropicEstimate read a request's
// body through GetBody, and leave it whole: a token for each four bytes and
// one more, and the answer's max tokens (each spelling), else the default;
// a body they cannot read again (no GetBody) or longer than
// MaxEstimatedBody, by its length alone; a body of no JSON, the default.
func TestEstimates(t *testing.T) {
	chat := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`
	chatTokens := len(chat)/4 + 1
	long := strings.Repeat("x", MaxEstimatedBody+3)
	for _, tc := range []struct {
		name        string
		req         func() *http.Request
		prompt, out int
	}{
		{name: "max_tokens", req: func() *http.Request { return post(chat) }, prompt: chatTokens, out: 100},
		{name: "max_completion_tokens", req: func() *http.Request { return post(`{"max_completion_tokens":50,"max_tokens":9}`) }, prompt: 11, out: 50},
		{name: "max_output_tokens", req: func() *http.Request { return post(`{"max_output_tokens":7}`) }, prompt: 6, out: 7},
		{name: "none: the default", req: func() *http.Request { return post(`{"model":"m"}`) }, prompt: 4, out: 4096},
		{name: "not JSON", req: func() *http.Request { return post(`max_tokens=5`) }, prompt: 4, out: 4096},
		{name: "no GetBody", req: func() *http.Request {
			r := post(chat)
			r.GetBody = nil
			return r
		}, prompt: chatTokens, out: 4096},
		{name: "longer than MaxEstimatedBody", req: func() *http.Request { return post(long) }, prompt: (MaxEstimatedBody+3)/4 + 1, out: 4096},
		{name: "no body", req: func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
			return r
		}, prompt: 1, out: 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req()
			got := OpenAIEstimate("tokens", 4096)(req)
			split := AnthropicEstimate("input", "output", 4096)(req)
			onlyIn := AnthropicEstimate("input", "", 4096)(req)
			if got["tokens"] != tc.prompt+tc.out || split["input"] != tc.prompt || split["output"] != tc.out || len(onlyIn) != 1 {
				t.Errorf("OpenAI %v, Anthropic %v and %v; want tokens %d, input %d, output %d, and input alone", got, split, onlyIn, tc.prompt+tc.out, tc.prompt, tc.out)
			}
			if req.Body != nil && req.Body != http.NoBody && req.GetBody != nil {
				if body, _ := io.ReadAll(req.Body); len(body) == 0 {
					t.Errorf("the request's body was read: %d bytes left", len(body))
				}
			}
		})
	}
}

// post is a POST of body to an LLM API, as http.NewRequest makes it: its
// GetBody set.
func post(body string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "https://api.openai.com/v1/chat/completions", bytes.NewReader([]byte(body)))
	return r
}

// FuzzRequestTokens: whatever a body's start and length, RequestTokens
// never panics, and its estimates are positive.
func FuzzRequestTokens(f *testing.F) {
	f.Add([]byte(`{"max_tokens":100}`), int64(18))
	f.Add([]byte(`{"max_tokens":1e99}`), int64(-1))
	f.Add([]byte(`{"max_output_tokens":-5`), int64(1<<40))
	f.Fuzz(func(t *testing.T, head []byte, size int64) {
		prompt, out := RequestTokens(head, size, 10)
		if prompt < 1 || out < 1 {
			t.Errorf("RequestTokens(%q, %d) = %d, %d; want both 1 or more", head, size, prompt, out)
		}
	})
}
