package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace"
)

// TestAPICountsWhatItAccepted: the tokens a request uses count from the
// moment the API accepts it, as many as its answer's usage says, though the
// answer is still being written: the summary, taken as the run ends, counts
// the answers cut by the end too (it missed one of 154 in a run that read
// 94.8% of the tokens).
func TestAPICountsWhatItAccepted(t *testing.T) {
	start := time.Now()
	upstream := newAPI(pace.PerMinute(300), pace.PerMinute(30000), start, start.Add(time.Minute))
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	body := `{"model":"loopback","messages":[{"role":"user","content":"pace shares one quota"}],"max_tokens":300,"stream":true,"stream_options":{"include_usage":true}}`
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	served, _, atHeaders := upstream.counts() // the stream's first chunk is out, 4 are to come
	var usage struct {
		Usage *struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if data, ok := bytes.CutPrefix(lines.Bytes(), []byte("data: {")); ok {
			json.Unmarshal(append([]byte("{"), data...), &usage)
		}
		if usage.Usage != nil {
			break
		}
	}
	if resp.StatusCode != http.StatusOK || usage.Usage == nil {
		t.Fatalf("status %d, usage %v: want 200 and a usage", resp.StatusCode, usage.Usage)
	}
	if served != 1 || atHeaders != usage.Usage.TotalTokens {
		t.Errorf("while the answer streams: %d served, %d tokens used; want 1 and the %d tokens of its usage", served, atHeaders, usage.Usage.TotalTokens)
	}
}
