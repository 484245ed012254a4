package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/fleetpace/pace"
	"github.com/fleetpace/pace/internal/quotaapi"
)

// summary is what the demo reports, as a table or as JSON.
type summary struct {
	Limit       string    `json:"limit"`
	Mode        string    `json:"mode"`
	Processes   int       `json:"processes"`
	Workers     int       `json:"workers"`
	Busy        int       `json:"busy_workers"`
	Seconds     float64   `json:"seconds"`
	Requests    int       `json:"requests"`
	OK          int       `json:"ok"`
	TooMany     int       `json:"too_many_requests"`
	Rate        float64   `json:"rate"`          // 200s per second
	LimitRate   float64   `json:"limit_rate"`    // the limit's rate
	Utilisation float64   `json:"utilisation"`   // OK / what the quota allows: burst + rate*seconds - ForeignOK, or, if fewer, InFlightCap*seconds/service
	InFlightCap int       `json:"in_flight_cap"` // -concurrency; 0 for none
	MaxInFlight int       `json:"max_in_flight"` // the most requests the built-in upstream served at once
	Headers     string    `json:"headers"`       // the dialect of the built-in upstream's counters
	ForeignRate float64   `json:"foreign_rate"`  // the foreign client's requests per second
	ForeignOK   int       `json:"foreign_ok"`    // 200s to the foreign client
	Foreign429  int       `json:"foreign_too_many_requests"`
	ScriptCalls *float64  `json:"redis_calls_per_request"` // script round trips (FCALL, EVALSHA, EVAL) per request; null without Redis
	SyncCalls   *float64  `json:"sync_calls_per_request"`  // of them, those that synced the upstream's counters
	PerProcess  []process `json:"per_process"`
	// WaitP50 and WaitP99 are the fleet's waits: those the requests
	// waited, or, in a dry run, those their limiters reported; BookedP50
	// and BookedP99, those their limiters booked (see request.Booked).
	WaitP50   float64 `json:"wait_p50_ms"`
	WaitP99   float64 `json:"wait_p99_ms"`
	BookedP50 float64 `json:"booked_p50_ms"`
	BookedP99 float64 `json:"booked_p99_ms"`
	DryRun    bool    `json:"dry_run"`
	// TooManyLate counts the 429s to requests granted after the run's
	// first second.
	TooManyLate int `json:"too_many_requests_after_1s"`
	// PerSecond counts the answers to the requests granted in each second
	// of the run.
	PerSecond []second `json:"per_second"`
	// With -priority: the critical requests, and their waits.
	Critical        int     `json:"critical_requests"`
	CriticalWaitP50 float64 `json:"critical_wait_p50_ms"`
	CriticalWaitMax float64 `json:"critical_wait_max_ms"`
	// With -metrics: where the workers served their metrics, and the
	// decisions the metrics counted (pace_decisions_total), scraped at
	// the end.
	MetricsURLs      []string `json:"metrics_urls,omitempty"`
	MetricsDecisions float64  `json:"metrics_decisions"`
	// What the limiters told their observers: Redis away from OutageFrom to
	// OutageTo, in seconds into the run (-1: none, or not back), Alone
	// requests decided without it meanwhile; the holds heard, and the cuts
	// of a key's rate, the lowest to LowestRate of the limit's.
	OutageFrom float64 `json:"outage_from_s"`
	OutageTo   float64 `json:"outage_to_s"`
	Alone      int     `json:"granted_alone"`
	Holds      int     `json:"holds"`
	Cuts       int     `json:"rate_cuts"`
	LowestRate float64 `json:"lowest_rate"`
}

type process struct {
	Requests int     `json:"requests"`
	WaitP50  float64 `json:"wait_p50_ms"`
	WaitP99  float64 `json:"wait_p99_ms"`
}

// summarize sums up the workers' reports and what the built-in upstream
// answered the foreign client.
func summarize(c config, limit pace.Limit, start time.Time, reports []report, upstream quotaapi.Counts) summary {
	s := summary{Limit: limit.String(), Mode: "shared through Redis", Processes: c.Procs, Workers: c.Procs * c.Workers,
		Busy: c.Procs*c.Workers - c.Idle, Seconds: c.Duration.Seconds(), LimitRate: limit.Rate(),
		Headers: c.Headers, ForeignRate: c.Foreign, ForeignOK: upstream.ForeignOK, Foreign429: upstream.ForeignRefused,
		InFlightCap: c.Concurrency, MaxInFlight: upstream.MaxInFlight, DryRun: c.DryRun}
	switch {
	case c.Local:
		s.Mode = "each process alone at 1/" + fmt.Sprint(c.Procs) + " of the limit (pace.Local)"
	case c.Redis == "":
		s.Mode += " (embedded store)"
	}
	var scriptCalls, syncCalls int64
	var all, booked []time.Duration
	for _, r := range reports {
		for _, q := range r.Requests {
			booked = append(booked, q.Booked)
		}
		scriptCalls += r.ScriptCalls
		syncCalls += r.SyncCalls
		if r.MetricsURL != "" {
			s.MetricsURLs = append(s.MetricsURLs, r.MetricsURL)
			s.MetricsDecisions += r.MetricsDecisions
		}
		waits := s.count(r.Requests, start)
		all = append(all, waits...)
		s.PerProcess = append(s.PerProcess, process{Requests: len(r.Requests), WaitP50: percentile(waits, 0.50), WaitP99: percentile(waits, 0.99)})
		if len(r.Critical) > 0 { // with -priority
			waits := s.count(r.Critical, start)
			s.Critical += len(r.Critical)
			s.CriticalWaitP50, s.CriticalWaitMax = percentile(waits, 0.5), percentile(waits, 1)
		}
	}
	s.addHappenings(start, reports)
	s.WaitP50, s.WaitP99 = percentile(all, 0.50), percentile(all, 0.99)
	s.BookedP50, s.BookedP99 = percentile(booked, 0.50), percentile(booked, 0.99)
	s.Rate = float64(s.OK) / s.Seconds
	allowed := float64(limit.Burst()) + limit.Rate()*s.Seconds - float64(s.ForeignOK)
	if c.Concurrency > 0 {
		allowed = min(allowed, float64(c.Concurrency)*s.Seconds/service.Seconds())
	}
	s.Utilisation = float64(s.OK) / allowed
	if !c.Local && s.Requests > 0 {
		perRequest, syncs := float64(scriptCalls)/float64(s.Requests), float64(syncCalls)/float64(s.Requests)
		s.ScriptCalls, s.SyncCalls = &perRequest, &syncs
	}
	return s
}

// addHappenings sums up what the processes' limiters told their
// observers: the outage, from the first fallback to the last recovery.
func (s *summary) addHappenings(start time.Time, reports []report) {
	s.OutageFrom, s.OutageTo = -1, -1
	var from, to time.Time
	back := true
	for _, r := range reports {
		h := r.Happened
		if !h.OutageFrom.IsZero() && (from.IsZero() || h.OutageFrom.Before(from)) {
			from = h.OutageFrom
		}
		back = back && (h.OutageFrom.IsZero() || !h.OutageTo.IsZero())
		if h.OutageTo.After(to) {
			to = h.OutageTo
		}
		s.Alone, s.Holds, s.Cuts = s.Alone+h.Alone, s.Holds+h.Holds, s.Cuts+h.Cuts
		if h.LowestRate > 0 && (s.LowestRate == 0 || h.LowestRate < s.LowestRate) {
			s.LowestRate = h.LowestRate
		}
	}
	if !from.IsZero() {
		s.OutageFrom = from.Sub(start).Seconds()
		if back && !to.IsZero() {
			s.OutageTo = to.Sub(start).Seconds()
		}
	}
}

// second counts the answers to the requests granted in one second.
type second struct {
	OK      int `json:"ok"`
	TooMany int `json:"too_many_requests"`
}

// count counts requests and their answers, and returns their waits; the
// run started at start.
func (s *summary) count(requests []request, start time.Time) []time.Duration {
	var waits []time.Duration
	for _, q := range requests {
		s.Requests++
		at := max(int(q.Granted.Sub(start)/time.Second), 0)
		for len(s.PerSecond) <= at {
			s.PerSecond = append(s.PerSecond, second{})
		}
		switch q.Status {
		case 200:
			s.OK++
			s.PerSecond[at].OK++
		case 429:
			s.TooMany++
			s.PerSecond[at].TooMany++
			if at >= 1 {
				s.TooManyLate++
			}
		}
		waits = append(waits, q.Wait)
	}
	return waits
}

func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[int(p*float64(len(d)-1))]) / float64(time.Millisecond)
}

func (s summary) print(w io.Writer) {
	fmt.Fprintf(w, "limit           %s, %v\n", s.Limit, s.Mode)
	fmt.Fprintf(w, "fleet           %d processes, %d workers, %d busy, %.1fs\n", s.Processes, s.Workers, s.Busy, s.Seconds)
	fmt.Fprintf(w, "achieved        %.1f/s: %d answered 200 of %d requests\n", s.Rate, s.OK, s.Requests)
	fmt.Fprintf(w, "utilisation     %.1f%% of what the limit allows (burst + rate x time, less the foreign client's)\n", 100*s.Utilisation)
	fmt.Fprintf(w, "429s            %d, %d of them after the first second\n", s.TooMany, s.TooManyLate)
	if s.DryRun {
		fmt.Fprintf(w, "dry run         nothing waited: the waits are those the limiters would impose, p50 %.1fms, p99 %.1fms\n", s.WaitP50, s.WaitP99)
	}
	if s.ForeignRate > 0 {
		fmt.Fprintf(w, "foreign client  %d answered 200 at %.4g/s, %d 429s\n", s.ForeignOK, s.ForeignRate, s.Foreign429)
	}
	if s.Headers != "" {
		fmt.Fprintf(w, "counters        the upstream speaks %s\n", s.Headers)
	}
	if s.InFlightCap > 0 {
		fmt.Fprintf(w, "in flight       at most %d at once at the upstream (cap %d, 50 ms a request)\n", s.MaxInFlight, s.InFlightCap)
	}
	if s.Critical > 0 {
		fmt.Fprintf(w, "critical        %d requests beside the batch ones, waited %.1fms (p50), %.1fms at most\n", s.Critical, s.CriticalWaitP50, s.CriticalWaitMax)
	}
	if len(s.MetricsURLs) > 0 {
		fmt.Fprintf(w, "metrics         %s (%.0f decisions counted)\n", strings.Join(s.MetricsURLs, " "), s.MetricsDecisions)
	}
	s.printHappenings(w)
	if s.ScriptCalls != nil {
		fmt.Fprintf(w, "Redis calls     %.2f per request (script round trips), %.2f of them to sync the upstream's counters\n", *s.ScriptCalls, *s.SyncCalls)
	}
	fmt.Fprintf(w, "\nprocess  requests  wait p50  wait p99\n")
	for i, p := range s.PerProcess {
		fmt.Fprintf(w, "%7d  %8d  %6.1fms  %6.1fms\n", i, p.Requests, p.WaitP50, p.WaitP99)
	}
}

// plot draws requests per second over time, a line for each process, a
// black one for the whole fleet and a dashed one for the limit, as an SVG
// document.
func plot(c config, limit pace.Limit, start time.Time, reports []report) []byte {
	const width, height, left, bottom, bin = 800.0, 400.0, 60.0, 40.0, 250 * time.Millisecond
	bins := int(c.Duration / bin)
	counts := make([][]float64, len(reports)+1) // the processes', then the fleet's
	for i := range counts {
		counts[i] = make([]float64, bins)
	}
	fleet := counts[len(reports)]
	for i, r := range reports {
		for _, q := range r.Requests {
			if b := int(q.Granted.Sub(start) / bin); b >= 0 && b < bins && q.Status == 200 {
				counts[i][b] += 1 / bin.Seconds()
				fleet[b] += 1 / bin.Seconds()
			}
		}
	}
	top := max(limit.Rate()*1.25, slices.Max(append(fleet, 0)))
	x := func(b int) float64 { return left + (width-left-10)*float64(b)/float64(max(bins-1, 1)) }
	y := func(v float64) float64 { return height - bottom - (height-bottom-10)*v/top }
	var svg strings.Builder
	fmt.Fprintf(&svg, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&svg, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&svg, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", left, y(0), width-10, y(0))
	fmt.Fprintf(&svg, `<line x1="%g" y1="10" x2="%g" y2="%g" stroke="black"/>`+"\n", left, left, y(0))
	for _, v := range []float64{0, top / 2, top} {
		fmt.Fprintf(&svg, `<text x="%g" y="%g" text-anchor="end">%.0f/s</text>`+"\n", left-5, y(v)+4, v)
	}
	fmt.Fprintf(&svg, `<text x="%g" y="%g" text-anchor="middle">seconds (%v bins); requests per second of each process and of the fleet; dashed: the limit, %s</text>`+"\n",
		(width+left)/2, height-10, bin, limit)
	for s := 0; s <= int(c.Duration.Seconds()); s++ {
		b := int(time.Duration(s) * time.Second / bin)
		fmt.Fprintf(&svg, `<text x="%g" y="%g" text-anchor="middle">%d</text>`+"\n", x(b), y(0)+15, s)
	}
	fmt.Fprintf(&svg, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="red" stroke-dasharray="6 4"/>`+"\n", left, y(limit.Rate()), width-10, y(limit.Rate()))
	colors := []string{"#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"}
	for i, row := range counts {
		color, name := colors[i%len(colors)], fmt.Sprintf("process %d", i)
		if i == len(reports) {
			color, name = "black", "the fleet"
		}
		var points []string
		for b, v := range row {
			points = append(points, fmt.Sprintf("%.1f,%.1f", x(b), y(v)))
		}
		fmt.Fprintf(&svg, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.Join(points, " "))
		fmt.Fprintf(&svg, `<text x="%g" y="%g" fill="%s">%s</text>`+"\n", width-90, 25+15*float64(i), color, name)
	}
	svg.WriteString("</svg>\n")
	return []byte(svg.String())
}

// printHappenings prints what the limiters told their observers: the
// outage, the holds, the rate cuts; nothing of what did not happen.
func (s summary) printHappenings(w io.Writer) {
	switch {
	case s.OutageFrom >= 0 && s.OutageTo >= 0:
		fmt.Fprintf(w, "outage          Redis away from %.2fs to %.2fs into the run (first fallback to last recovery): %d requests granted by processes alone, each at its share of the limit\n", s.OutageFrom, s.OutageTo, s.Alone)
	case s.OutageFrom >= 0:
		fmt.Fprintf(w, "outage          Redis away from %.2fs into the run to its end: %d requests granted by processes alone, each at its share of the limit\n", s.OutageFrom, s.Alone)
	}
	if s.Holds > 0 {
		fmt.Fprintf(w, "holds           %d heard: the upstream said to wait (Retry-After, or counters of none left), and the fleet did\n", s.Holds)
	}
	if s.Cuts > 0 {
		fmt.Fprintf(w, "rate cuts       %d, to %.0f%% of the limit's rate at the lowest: refusals that no counters explained\n", s.Cuts, 100*s.LowestRate)
	}
}
