package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// TestCrawl: three loopback sites, 8 pages each, at 20 a second per host
// (burst 1): every page fetched, and no host faster than its limit: its 8th
// page no sooner than 7 x 50 ms after the start. When the embedded store was
// too slow to answer (this test runs beside others, under the race
// detector), each switch to local pacing and back may let one more page
// through (docs/failures.md): the bound allows a burst for each.
func TestCrawl(t *testing.T) {
	var out bytes.Buffer
	if err := crawl(&out, "", "", 20, 8, 6); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	hosts := regexp.MustCompile(`(\d+) pages, the last +(\d+)ms`).FindAllStringSubmatch(out.String(), -1)
	if len(hosts) != 3 {
		t.Fatalf("%d hosts reported, want 3", len(hosts))
	}
	switches := 0
	if m := regexp.MustCompile(`Redis failed (\d+) times`).FindStringSubmatch(out.String()); m != nil {
		outages, _ := strconv.Atoi(m[1])
		switches = 2 * outages
	}
	least := 50 * max(7-switches, 0)
	for _, m := range hosts {
		pages, _ := strconv.Atoi(m[1])
		last, _ := strconv.Atoi(m[2])
		if pages != 8 || last < least {
			t.Errorf("a host got %d pages, the last %d ms in; want 8, the last no sooner than %d ms", pages, last, least)
		}
	}
}
