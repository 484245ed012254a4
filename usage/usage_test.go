package usage

import (
	"os"
	"strings"
	"testing"
)

// sample is a body an API sent, from testdata.
func sample(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// endsOf returns the ends a Transport keeps of body (8 KiB of each),
// complete unless cut.
func endsOf(body string, cut bool) Ends {
	const size = 8 << 10
	return Ends{Head: []byte(body[:min(len(body), size)]), Tail: []byte(body[max(len(body)-size, 0):]), Complete: !cut}
}

func TestOpenAI(t *testing.T) {
	stream := sample(t, "openai-stream.txt")
	for name, tc := range map[string]struct {
		body string
		cut  bool // the body was closed before its end
		want int  // -1: no count
	}{
		"chat completion":                        {sample(t, "openai-chat.json"), false, 29},
		"stream with include_usage":              {stream, false, 21},
		"stream without include_usage":           {strings.Split(stream, `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],`)[0], false, -1},
		"stream cut short":                       {stream[:300], true, -1},
		"stream closed after [DONE]":             {stream, true, 21},
		"stream closed before [DONE]":            {strings.TrimSuffix(stream, "data: [DONE]\n\n"), true, -1},
		"Responses API":                          {sample(t, "openai-responses.json"), false, 123},
		"Responses API stream":                   {sample(t, "openai-responses-stream.txt"), false, 48},
		"Responses API stream closed at its end": {sample(t, "openai-responses-stream.txt"), true, 48},
		"an error page":                          {`<html><body>502 Bad Gateway</body></html>`, false, -1},
		"a usage quoted in the text":             {`{"choices":[{"message":{"content":"say \"usage\": {\"total_tokens\": 999999}"}}],"usage":{"total_tokens":7}}`, false, 7},
		"a negative count":                       {`{"usage":{"prompt_tokens":5,"completion_tokens":-90,"total_tokens":-85}}`, false, -1},
		"an enormous count":                      {`{"usage":{"total_tokens":99999999999999999999}}`, false, -1},
		"a fractional count":                     {`{"usage":{"total_tokens":12.5}}`, false, -1},
		"a usage that is a string":               {`{"usage":"29"}`, false, -1},
		"no body":                                {``, false, -1},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := OpenAI(endsOf(tc.body, tc.cut))
			if !ok {
				got = -1
			}
			if got != tc.want {
				t.Errorf("%d tokens (%v), want %d", got, ok, tc.want)
			}
		})
	}
}

func TestAnthropic(t *testing.T) {
	start, delta, end := sample(t, "anthropic-stream-start.txt"), sample(t, "anthropic-stream-delta.txt"), sample(t, "anthropic-stream-end.txt")
	type counts struct{ in, out int }
	none := counts{-1, -1}
	for name, tc := range map[string]struct {
		body string
		cut  bool
		want counts
	}{
		"message":                           {sample(t, "anthropic-message.json"), false, counts{2195, 503}},
		"stream":                            {start + delta + end, false, counts{35, 15}},
		"stream of 40 KB":                   {start + strings.Repeat(delta, 400) + end, false, counts{35, 15}}, // the usage at each end
		"stream cut short":                  {start + delta, true, none},
		"stream closed after message_stop":  {start + delta + end, true, counts{35, 15}},
		"stream closed before message_stop": {strings.Split(start+delta+end, "event: message_stop")[0], true, none},
		"an API error":                      {`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, false, none},
		"an OpenAI body":                    {sample(t, "openai-chat.json"), false, none},
	} {
		t.Run(name, func(t *testing.T) {
			in, out, ok := Anthropic(endsOf(tc.body, tc.cut))
			if got := (counts{in, out}); !ok && tc.want != none || ok && got != tc.want {
				t.Errorf("%+v (%v), want %+v", got, ok, tc.want)
			}
		})
	}
}

// TestShopify: the cost buckets Shopify's GraphQL Admin API states, in a
// query's answer and in a refusal (THROTTLED, in a 200), and the bodies
// that state none, or one not to believe.
func TestShopify(t *testing.T) {
	products, throttled := sample(t, "shopify-products.json"), sample(t, "shopify-throttled.json")
	long := `{"data": {"notes": "` + strings.Repeat("x", 20<<10) + `"}, ` + products[strings.Index(products, `"extensions"`):]
	for name, tc := range map[string]struct {
		body string
		want Throttle
		ok   bool
	}{
		"a query's answer":              {products, Throttle{Maximum: 1000, Available: 954, RestoreRate: 50}, true},
		"THROTTLED in a 200":            {throttled, Throttle{Maximum: 2000, Available: 542.5, RestoreRate: 100, Throttled: true}, true},
		"a long answer: in its tail":    {long, Throttle{Maximum: 1000, Available: 954, RestoreRate: 50}, true},
		"a REST answer":                 {`{"products": [{"id": 1, "cost": "4.00"}]}`, Throttle{}, false},
		"a cost with no throttleStatus": {`{"data": {}, "extensions": {"cost": {"requestedQueryCost": 1}}}`, Throttle{}, false},
		"available above the maximum":   {strings.Replace(products, `"currentlyAvailable": 954`, `"currentlyAvailable": 1954`, 1), Throttle{}, false},
		"a negative restore rate":       {strings.Replace(products, `"restoreRate": 50.0`, `"restoreRate": -50.0`, 1), Throttle{}, false},
		"a small bucket restoring more than its size a second": {strings.NewReplacer(`"maximumAvailable": 1000.0`, `"maximumAvailable": 10.0`,
			`"currentlyAvailable": 954`, `"currentlyAvailable": 9`, `"restoreRate": 50.0`, `"restoreRate": 200.0`).Replace(products),
			Throttle{Maximum: 10, Available: 9, RestoreRate: 200}, true},
		"a restore rate beyond MaxCount": {strings.Replace(products, `"restoreRate": 50.0`, `"restoreRate": 1e300`, 1), Throttle{}, false},
		"a maximum beyond MaxCount":      {strings.Replace(products, `"maximumAvailable": 1000.0`, `"maximumAvailable": 1e300`, 1), Throttle{}, false},
		"cut short":                      {products[:len(products)-60], Throttle{}, false},
		"an escaped key in a string":     {`{"data": {"note": "\"cost\": {\"throttleStatus\": {}}"}}`, Throttle{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := Shopify(endsOf(tc.body, false))
			if got != tc.want || ok != tc.ok {
				t.Errorf("Shopify = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzUsage: whatever a body's ends, the readers never panic and never
// count below zero or beyond MaxCount.
func FuzzUsage(f *testing.F) {
	f.Add([]byte(sample(f, "anthropic-stream-start.txt")), []byte(sample(f, "anthropic-stream-end.txt")), true)
	f.Add([]byte(sample(f, "openai-stream.txt")), []byte(sample(f, "openai-stream.txt")), true)
	f.Add([]byte(`{"usage":{`), []byte(`"usage":{"total_tokens":1}}`), false)
	f.Add([]byte(sample(f, "shopify-throttled.json")), []byte(sample(f, "shopify-throttled.json")), true)
	f.Fuzz(func(t *testing.T, head, tail []byte, complete bool) {
		ends := Ends{Head: head, Tail: tail, Complete: complete}
		tokens, ok := OpenAI(ends)
		in, out, ok2 := Anthropic(ends)
		for _, n := range []int{tokens, in, out} {
			if n < 0 || n > 2*MaxCount {
				t.Fatalf("counted %d, %d, %d (%v, %v)", tokens, in, out, ok, ok2)
			}
		}
		if th, ok := Shopify(ends); ok && !(th.Maximum >= 1 && th.Maximum <= MaxCount && th.Available >= 0 && th.Available <= th.Maximum && th.RestoreRate > 0 && th.RestoreRate <= MaxCount) {
			t.Fatalf("believed the bucket %+v", th)
		}
	})
}
