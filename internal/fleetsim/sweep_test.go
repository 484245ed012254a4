package fleetsim

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	seeds    = flag.Int("seeds", 0, "runs drawn across the space, seeds 1 to N (0: the 150 of go test)")
	caseSpec = flag.String("case", "", "run one case: key=value pairs, such as \"upstream=nginx rate=50 limit='100/s burst 5'\"")
	jsonOut  = flag.String("json", "", "write the runs' results to this file as JSON")
)

// defaultSeeds is how many drawn runs go test makes without -seeds: about
// 20 s here (see race_test.go).
var defaultSeeds = 150

// TestSweep runs cases drawn across the upstreams' whole space (or the one
// -case names), checks the invariants in each, and logs a table of what
// each served and refused (go test -v shows it). A run that breaks an
// invariant fails the test and prints its case, which -case replays.
func TestSweep(t *testing.T) {
	t.Parallel()
	var cases []Case
	switch {
	case *caseSpec != "":
		c, err := Parse(*caseSpec)
		if err != nil {
			t.Fatal(err)
		}
		cases = []Case{c}
	default:
		n := *seeds
		if n == 0 {
			n = defaultSeeds
		}
		for seed := range uint64(n) {
			cases = append(cases, Draw(seed+1))
		}
	}
	results := make([]Result, len(cases))
	for i, c := range cases {
		results[i] = Run(t, c)
		for _, v := range results[i].Violations {
			t.Errorf("case %s\n  %s\n  replay: go test ./internal/fleetsim -run '^TestSweep$' -count=1 -v -args -case \"%s\"", c, v, c)
		}
	}
	if *caseSpec != "" && testing.Verbose() {
		t.Log("the run's arrivals and events:\n" + strings.Join(results[0].Trace, "\n"))
	}
	t.Log("\n" + table(results))
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, results); err != nil {
			t.Fatal(err)
		}
	}
}

// table writes one line a run, and then a line per family and dialect.
func table(results []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %6s %8s %7s %9s %5s %8s %6s  %s\n", "util", "demand", "refused", "after1s", "violation", "errs", "longest", "calls", "case")
	for _, r := range results {
		fmt.Fprintf(&b, "%6.3f %6.2f %8d %7d %9d %5d %8v %6d  %s\n", r.Utilisation(), min(r.Demand/r.Allowed, 99), r.Refused, r.RefusedAfter1s, len(r.Violations), r.Errors, r.LongestWait.Round(time.Millisecond), r.RedisCalls, r.Case)
	}
	b.WriteString(summary(results))
	return b.String()
}

// summary groups the runs by family and by how refusals are said, with
// the least and the mean utilisation of each group.
func summary(results []Result) string {
	type group struct {
		runs, refused, after1s, violations int
		util, least                        float64
	}
	groups := map[string]*group{}
	for _, r := range results {
		said := "plain"
		if r.Case.RetryAfter != "" {
			said = "retry_after=" + r.Case.RetryAfter
		}
		for _, k := range []string{"upstream=" + r.Case.Upstream, said, "counters=" + r.Case.Counters, "body=" + r.Case.Body, "faults=" + r.Case.Faults, burstBand(r.Case), configured(r.Case)} {
			g := groups[k]
			if g == nil {
				g = &group{least: 2}
				groups[k] = g
			}
			g.runs++
			g.refused += r.Refused
			g.after1s += r.RefusedAfter1s
			g.violations += len(r.Violations)
			g.util += r.Utilisation()
			g.least = min(g.least, r.Utilisation())
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-22s %5s %9s %9s %8s %7s %10s\n", "group", "runs", "mean util", "min util", "refused", "after1s", "violations")
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		g := groups[k]
		fmt.Fprintf(&b, "%-22s %5d %9.3f %9.3f %8d %7d %10d\n", k, g.runs, g.util/float64(g.runs), g.least, g.refused, g.after1s, g.violations)
	}
	return b.String()
}

// burstBand names the band of c's burst.
func burstBand(c Case) string {
	switch {
	case c.Burst == 1:
		return "burst 1"
	case c.Burst <= 5:
		return "burst 2-5"
	}
	return "burst 6-20"
}

// configured says how pace's limit stands to the upstream's: their rates,
// or, against an upstream with no burst of its own (a window, HAProxy's
// sliding second), what each allows in one of the upstream's periods: a
// bucket at a window's rate allows its burst more than the window in the
// first, which the window refuses.
func configured(c Case) string {
	l, _ := c.paceLimit()
	ratio := l.Rate() / c.upstreamRate()
	if c.Upstream != "strict" && c.Upstream != "nginx" {
		ratio = (float64(l.Burst()) + l.Rate()*c.period().Seconds()) / c.Rate
	}
	switch {
	case ratio < 1:
		return "pace below"
	case ratio > 1:
		return "pace above"
	}
	return "pace matched"
}

// writeJSON writes the results as the sweep's JSON.
func writeJSON(path string, results []Result) error {
	type jsonCase struct {
		Case           string  `json:"case"`
		Utilisation    float64 `json:"utilisation"`
		Served         int     `json:"served"`
		Demand         float64 `json:"demand"` // of what was allowed (see Result.Demand), 99 at most
		Refused        int     `json:"refused"`
		RefusedAfter1s int     `json:"refused_after_1s"`
		Violations     int     `json:"violations"`
		FirstHold      float64 `json:"first_hold_s"` // see Result.FirstHold
		Configured     string  `json:"configured"`   // see configured
		OthersServed   int     `json:"others_served"`
		OthersRefused  int     `json:"others_refused"`
	}
	out := struct {
		Runs       int        `json:"runs"`
		Violations int        `json:"violations"`
		Cases      []jsonCase `json:"cases"`
	}{Runs: len(results)}
	for _, r := range results {
		out.Violations += len(r.Violations)
		out.Cases = append(out.Cases, jsonCase{r.Case.String(), r.Utilisation(), r.Served, min(r.Demand/r.Allowed, 99), r.Refused, r.RefusedAfter1s, len(r.Violations), r.FirstHold.Seconds(), configured(r.Case), r.OthersServed, r.OthersRefused})
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
