package pace

import (
	"maps"
	"net/http"
	"os"
	"testing"

	"github.com/fleetpace/pace/usage"
)

// apiSample is a body an API sent, from usage/testdata.
func apiSample(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("usage/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// endsOf returns the ends a Transport keeps of body, read whole.
func endsOf(body string, complete bool) usage.Ends {
	b := &endingBody{}
	b.keep([]byte(body))
	return usage.Ends{Head: b.head, Tail: b.tail[max(len(b.tail)-BodyEndSize, 0):], Complete: complete}
}

// TestSettlers: the settlers put what the usage package reads (its own
// tests hold the formats) under the limits they name.
func TestSettlers(t *testing.T) {
	message := apiSample(t, "anthropic-message.json")
	for name, tc := range map[string]struct {
		settler Settler
		body    string
		want    Costs // nil: no settlement, the estimate stands
	}{
		"OpenAI":                    {OpenAIUsage("tokens"), apiSample(t, "openai-chat.json"), Costs{"tokens": 29}},
		"OpenAI, no usage":          {OpenAIUsage("tokens"), `{"error":{"message":"overloaded"}}`, nil},
		"Anthropic":                 {AnthropicUsage("input", "output"), message, Costs{"input": 2195, "output": 503}},
		"Anthropic, output only":    {AnthropicUsage("", "output"), message, Costs{"output": 503}},
		"Anthropic, input only":     {AnthropicUsage("input", ""), message, Costs{"input": 2195}},
		"Anthropic, an OpenAI body": {AnthropicUsage("input", "output"), apiSample(t, "openai-chat.json"), nil},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := tc.settler(&http.Response{Header: http.Header{}}, endsOf(tc.body, true))
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
		if got, ok := settler(resp, usage.Ends{Complete: true}); ok != (want != nil) || !maps.Equal(got, want) {
			t.Errorf("header %q: settled at %v (%v), want %v", value, got, ok, want)
		}
	}
}

// FuzzHeaderCost: whatever the header says, HeaderCost never panics and
// never settles at a negative cost.
func FuzzHeaderCost(f *testing.F) {
	f.Add("412")
	f.Add(" -7 ")
	settler := HeaderCost("X-Cost", "tokens")
	f.Fuzz(func(t *testing.T, value string) {
		costs, ok := settler(&http.Response{Header: http.Header{"X-Cost": {value}}}, usage.Ends{})
		if ok && costs["tokens"] < 0 {
			t.Fatalf("header %q settled at %v", value, costs)
		}
	})
}
