package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// TestCrawl: three loopback sites, 8 pages each, at 20 a second per host:
// every page fetched, and no host faster than its limit.
func TestCrawl(t *testing.T) {
	var out bytes.Buffer
	if err := crawl(&out, "", "", 20, 8, 6); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	rates := regexp.MustCompile(`(\d+) pages, ([\d.]+)/s`).FindAllStringSubmatch(out.String(), -1)
	if len(rates) != 3 {
		t.Fatalf("%d hosts reported, want 3", len(rates))
	}
	for _, m := range rates {
		pages, _ := strconv.Atoi(m[1])
		rate, _ := strconv.ParseFloat(m[2], 64)
		if pages != 8 || rate > 20*1.05 {
			t.Errorf("a host got %d pages at %.1f/s, want 8 at no more than 20/s", pages, rate)
		}
	}
}
