package headers

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// BodySize is the most of a response body HearBody reads: the start of a
// refusal's body, where its JSON says why.
const BodySize = 8 << 10

// SecondaryHold is the hold of GitHub's secondary limit when no header says
// how long: GitHub asks to wait at least a minute, and longer while the
// refusals go on (see Hold.Repeats).
const SecondaryHold = time.Minute

// Refuses reports whether resp may say in its body why it was refused: a
// 429, 403 or 503, whose body HearBody reads.
func Refuses(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusForbidden, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// HearBody adds to w, heard from a refusal's headers (Hear), the hold that
// the start of its body (head, at most BodySize bytes) asks for, capped at
// max, when its headers ask for none:
//
//   - Google's APIs (Gemini, Vertex AI): a 429 or 503 whose error's details
//     hold a google.rpc.RetryInfo, {"@type": ".../google.rpc.RetryInfo",
//     "retryDelay": "52s"}: a hold of the whole key for the delay;
//   - GitHub's secondary limit: a 403 or 429 whose message says "secondary
//     rate limit" (or, as GitHub said before, "abuse detection"): a hold of
//     SecondaryHold that Repeats.
//
// A body that is not JSON, is cut short, or says something else adds nothing.
func HearBody(w *Word, head []byte, max time.Duration) {
	if len(w.Holds) > 0 || !json.Valid(head) {
		return
	}
	var said refusalBody
	if len(head) > 0 && head[0] == '[' { // Google's REST answers a stream's error as a list of one
		var list []refusalBody
		if json.Unmarshal(head, &list) != nil || len(list) == 0 {
			return
		}
		said = list[0]
	} else if json.Unmarshal(head, &said) != nil {
		return
	}
	status := strconv.Itoa(w.Status) + " "
	if delay, text, ok := said.retryDelay(); ok && (w.Status == http.StatusTooManyRequests || w.Status == http.StatusServiceUnavailable) {
		if h := capHold(delay, max, Hold{Reason: status + "RetryInfo retryDelay: " + text}); h.For > 0 {
			w.Holds = append(w.Holds, h)
		}
		return
	}
	if said.secondary() && (w.Status == http.StatusForbidden || w.Status == http.StatusTooManyRequests) {
		h := capHold(SecondaryHold.Seconds(), max, Hold{Reason: status + "secondary rate limit: " + quoteStart(said.Message), Repeats: true})
		w.Holds = append(w.Holds, h)
	}
}

// refusalBody is what HearBody reads of a refusal's JSON: Google's error
// with its details, or GitHub's message.
type refusalBody struct {
	Error struct {
		Details []struct {
			Type       string `json:"@type"`
			RetryDelay string `json:"retryDelay"`
		} `json:"details"`
	} `json:"error"`
	Message          string `json:"message"`
	DocumentationURL string `json:"documentation_url"`
}

// retryDelay is the delay of the body's RetryInfo in seconds, and its text:
// a protobuf Duration in JSON, such as "52s" or "1.5s".
func (b refusalBody) retryDelay() (float64, string, bool) {
	for _, d := range b.Error.Details {
		if !strings.HasSuffix(d.Type, "google.rpc.RetryInfo") {
			continue
		}
		number, ok := strings.CutSuffix(d.RetryDelay, "s")
		seconds, err := strconv.ParseFloat(number, 64)
		if ok && err == nil && len(number) <= 32 && number[0] >= '0' && number[0] <= '9' {
			return seconds, d.RetryDelay, true
		}
	}
	return 0, "", false
}

// secondary reports whether the body is GitHub's refusal of a secondary
// rate limit.
func (b refusalBody) secondary() bool {
	message, docs := strings.ToLower(b.Message), strings.ToLower(b.DocumentationURL)
	return strings.Contains(message, "secondary rate limit") || strings.Contains(message, "abuse detection") ||
		strings.Contains(docs, "secondary-rate-limits") || strings.Contains(docs, "abuse-rate-limits")
}

// quoteStart quotes the start of a message, up to 60 bytes: enough to
// tell it in a hold's reason, never a whole body.
func quoteStart(message string) string {
	if len(message) > 60 {
		message = strings.ToValidUTF8(message[:60], "") + "..."
	}
	return strconv.Quote(message)
}
