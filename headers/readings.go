// Package headers reads what an upstream's response says of its quotas, in
// the dialects pace knows (GitHub's, the IETF draft's, OpenAI's and Azure's,
// Anthropic's): its counters (ParseReadings) and the holds they and its
// Retry-After ask for (ParseHold), on one clock (Hear). It reads the status
// and headers only, never the body, and bounds every value it takes. A new
// vendor's headers touch this package alone.
package headers

import (
	"cmp"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// A Reading is what a response said of one of the upstream's quotas: how
// many units of it are left, and when it resets (a window) or is full again
// (a quota that refills as time passes, as a token bucket does).
type Reading struct {
	// Name is the quota's name in its dialect: GitHub's resource ("core",
	// "search"), the IETF policy's name, "requests" or "tokens" (OpenAI),
	// "requests", "tokens", "input-tokens" or "output-tokens" (Anthropic);
	// "" when the headers name none.
	Name string
	// Limit is the quota's size, when the upstream says; else 0.
	Limit int64
	// Window is the time Limit is for, when known: the IETF policy's w, a
	// minute for OpenAI's and Anthropic's limits; else 0.
	Window time.Duration
	// Remaining is how many units are left.
	Remaining int64
	// Reset is the time from the response's arrival until the window
	// resets, or, when Refills, until the quota is full again.
	Reset   time.Duration
	Refills bool
	// Early is how much sooner than Reset the reset may come: a reset said
	// in whole seconds is rounded up, by a second at most (two against the
	// response's Date, itself a second late at most); else 0.
	Early time.Duration
	// Dated: the reset was said as a Unix time (GitHub's), one instant in
	// every response of a window, rather than as seconds from now.
	Dated bool
	// Refused: the answer that said so refused the request in its body, as
	// Shopify's THROTTLED does in a 200. Such a refusal says the fleet
	// outran the quota's refills, as a 429 does: it explains nothing.
	Refused bool
	// Header is what said so, such as "x-ratelimit-remaining: 299,
	// x-ratelimit-reset: 1700000600".
	Header string

	// OwnQuota: Name is a quota of its own (a GitHub resource other than
	// core), which a reading is about alone, even as a response's only one.
	OwnQuota bool
}

// Rounded reports whether r's reset, said in whole seconds, may come
// within a second: sooner than a second after it may be early (see
// Early), as a reset of 1 s may be now and a Unix time 1.3 s away may be
// 0.3 s away. The quota may come back at any time until then, all at once
// as a window's, or a few units at a time as a token bucket's that states
// the time until it is full (API gateways do so in GitHub's or the IETF
// draft's fields). Such a reading says how much is left, not that nothing
// comes back before its reset: it explains no refusal and tells no rate
// of others; it holds nothing when its reset may be now (a limiter holds
// nothing for a bucket's level either: see Hold.Reading).
func (r Reading) Rounded() bool { return r.Early > 0 && r.Reset-r.Early < time.Second }

// ParseReadings reads what a response says of the upstream's quotas; now is
// when it arrived. It reads every dialect pace knows, on any status:
//
//   - GitHub and the like: X-RateLimit-Limit, -Remaining, -Used, -Reset (a
//     Unix time above 1,000,000,000, else seconds from now) and -Resource
//     (the reading's name); X-Rate-Limit-* likewise;
//   - the IETF draft: RateLimit-Policy ("burst";q=100;w=60, several at
//     once) with RateLimit ("burst";r=50;t=30), and the older RateLimit
//     dictionary (limit=100, remaining=50, reset=30, with draft 7's policy
//     100;w=60) and RateLimit-Limit, -Remaining, -Reset; RateLimit and
//     RateLimit-Policy with a Beta- prefix too (Atlassian's);
//   - OpenAI (also Azure's): x-ratelimit-{limit,remaining,reset}-{requests,tokens},
//     resets as durations ("6m0s", "12ms"), a limit of -1 or 0 not reported;
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset},
//     resets as RFC 3339 times.
//
// A Unix or RFC 3339 reset is taken against now, or, when the response's
// Date header (the upstream's own clock) disagrees with now by more than its
// rounding to the second and a second of latency, against the Date; so is
// a Retry-After date (see ParseHold). A value that is malformed, negative,
// beyond store.MaxDelay or contradicted by its own headers (a remaining count
// above the limit, a used count that does not add up) is ignored. Of two
// readings of one name, the one with fewer units left wins.
//
// A reading is about the limit of the quota Named like it; the only reading
// of a response is about a quota's only rate limit too, unless it names a
// quota of its own: a GitHub resource other than core (search, graphql...)
// is about a limit of that name alone.
func ParseReadings(resp *http.Response, now time.Time) []Reading {
	clock := readingClock{header: resp.Header, now: now}
	return readAll(resp.Header, &clock)
}

// readAll reads every dialect's readings from h, on clock.
func readAll(h http.Header, clock *readingClock) []Reading {
	var readings readingSet
	for _, f := range &prefixedFamilies {
		readings.add(readPrefixed(h, f, clock))
	}
	for _, names := range &ietfNames {
		for _, r := range readIETF(h, names) {
			readings.add(r, true)
		}
	}
	for _, names := range &openAINames {
		readings.add(readMinuteQuota(h, names, clock))
	}
	for _, names := range &anthropicNames {
		readings.add(readMinuteQuota(h, names, clock))
	}
	return readings
}

// readingSet is the readings of a response, one a name.
type readingSet []Reading

// add adds r, when ok and sound; of two readings of one name, the one with
// fewer units left stays.
func (s *readingSet) add(r Reading, ok bool) {
	if !ok || r.Remaining < 0 || (r.Limit > 0 && r.Remaining > r.Limit) || r.Reset <= 0 || r.Reset > store.MaxDelay {
		return
	}
	for i, old := range *s {
		if old.Name == r.Name {
			if r.Remaining < old.Remaining {
				(*s)[i] = r
			}
			return
		}
	}
	*s = append(*s, r)
}

// readingClock is the clock a Unix or RFC 3339 reset is taken against: the
// arrival, or the response's Date, read once, when needed. The Date says
// when the upstream answered, to the second: the arrival, more precise,
// stands unless the two clocks disagree by more; where they disagree, the
// upstream's Clock, once it knows their offset within a second, moves the
// arrival by it (see Clock).
type readingClock struct {
	header   http.Header
	now      time.Time
	sent     time.Time // when the request went, for upstream
	upstream *Clock    // nil: none kept
	read     bool
	slack    time.Duration // how much later than now the upstream's clock may read: a second, for the Date's
}

func (c *readingClock) at() time.Time {
	if c.read {
		return c.now
	}
	c.read = true
	date, err := http.ParseTime(c.header.Get("Date"))
	if err != nil {
		return c.now
	}
	if lo, width, ok := c.upstream.learn(date, c.sent, c.now); ok {
		c.now, c.slack = c.now.Add(lo), width
	} else if c.now.Before(date.Add(-time.Second)) || c.now.After(date.Add(2*time.Second)) {
		c.now, c.slack = date, time.Second
	}
	return c.now
}

// prefixedNames are the header names of one family of X-RateLimit-* fields,
// in canonical form, read without building them anew.
type prefixedNames struct {
	prefix, limit, remaining, reset, used, resource string
	epochs                                          bool // a reset above 1,000,000,000 is a Unix time
}

var prefixedFamilies = [...]prefixedNames{
	newPrefixedNames("X-RateLimit-", true), newPrefixedNames("X-Rate-Limit-", true), newPrefixedNames("RateLimit-", false),
}

func newPrefixedNames(prefix string, epochs bool) prefixedNames {
	name := func(field string) string { return http.CanonicalHeaderKey(prefix + field) }
	return prefixedNames{prefix: prefix, limit: name("Limit"), remaining: name("Remaining"), reset: name("Reset"),
		used: name("Used"), resource: name("Resource"), epochs: epochs}
}

// readPrefixed reads one family of X-RateLimit-* fields: -Limit,
// -Remaining, -Reset, and GitHub's -Used and -Resource.
func readPrefixed(h http.Header, f prefixedNames, clock *readingClock) (Reading, bool) {
	remaining, reset := h.Get(f.remaining), h.Get(f.reset)
	if remaining == "" || reset == "" {
		return Reading{}, false
	}
	r := Reading{Name: h.Get(f.resource), Header: f.prefix + "Remaining: " + remaining + ", " + f.prefix + "Reset: " + reset}
	r.OwnQuota = r.Name != "" && !strings.EqualFold(r.Name, "core")
	var ok bool
	if r.Remaining, ok = count(remaining); !ok {
		return r, false
	}
	if limit := h.Get(f.limit); limit != "" {
		if r.Limit, ok = count(limit); !ok {
			return r, false
		}
	}
	if used := h.Get(f.used); used != "" {
		if n, ok := count(used); !ok || r.Limit == 0 || n+r.Remaining != r.Limit {
			return r, false
		}
	}
	r.Reset, r.Early, r.Dated, ok = secondsOrEpoch(reset, clock, f.epochs)
	return r, ok
}

// readIETF reads the IETF draft's RateLimit field, with the policies of
// RateLimit-Policy; or, in the older dictionary form, one reading.
func readIETF(h http.Header, names ietfFields) []Reading {
	field := h.Get(names.field)
	if field == "" {
		return nil
	}
	items, dict := structuredField(field)
	policyField := h.Get(names.policy)
	policies, _ := structuredField(policyField)
	if len(dict) > 0 {
		return readIETFDictionary(dict, policies, names.field+": "+field, names.policy+": "+policyField)
	}
	var readings []Reading
	for _, item := range items {
		r := Reading{Name: item.name, Header: names.field + ": " + field}
		var ok1, ok2 bool
		r.Remaining, ok1 = count(item.params["r"])
		r.Reset, r.Early, _, ok2 = secondsOrEpoch(item.params["t"], nil, false)
		if !ok1 || !ok2 {
			continue
		}
		for _, p := range policies {
			if p.name == item.name {
				r.Limit, _ = count(p.params["q"])
				r.Window = policyWindow(p)
				r.Header += ", " + names.policy + ": " + policyField
			}
		}
		readings = append(readings, r)
	}
	return readings
}

// readIETFDictionary reads the draft's older dictionary (draft 7 and
// express-rate-limit's draft-7 output: `limit=100, remaining=50,
// reset=30`), with its one policy's window (`100;w=60`), and says so in
// header and policyHeader.
func readIETFDictionary(dict map[string]string, policies []sfItem, header, policyHeader string) []Reading {
	r := Reading{Header: header}
	var ok1, ok2, ok3 bool
	r.Remaining, ok1 = count(dict["remaining"])
	r.Reset, r.Early, _, ok2 = secondsOrEpoch(dict["reset"], nil, false)
	r.Limit, ok3 = count(cmp.Or(dict["limit"], "0"))
	if !ok1 || !ok2 || !ok3 {
		return nil
	}
	if len(policies) == 1 {
		if q, ok := count(policies[0].name); ok && q == r.Limit {
			r.Window = policyWindow(policies[0])
			r.Header += ", " + policyHeader
		}
	}
	return []Reading{r}
}

// ietfFields names the IETF draft's two fields: RateLimit and
// RateLimit-Policy, or with the Beta- prefix Atlassian sends while the
// draft is one (`Beta-RateLimit: "tenant-app-quota";r=17842;t=2107`).
type ietfFields struct{ field, policy string }

var ietfNames = [...]ietfFields{{"RateLimit", "RateLimit-Policy"}, {"Beta-RateLimit", "Beta-RateLimit-Policy"}}

// policyWindow is a policy's window (its w), 0 when it states none that
// pace can hold.
func policyWindow(p sfItem) time.Duration {
	if w, ok := count(p.params["w"]); ok && w > 0 && w <= int64(store.MaxDelay/time.Second) {
		return time.Duration(w) * time.Second
	}
	return 0
}

// quotaNames are the header names of one quota of OpenAI's or Anthropic's,
// in canonical form: its name, its limit, remaining and reset fields, and
// whether its reset is an RFC 3339 time (Anthropic's) or a duration.
type quotaNames struct {
	name, limit, remaining, reset string
	rfc3339                       bool
}

var (
	openAINames    = [...]quotaNames{newOpenAINames("requests"), newOpenAINames("tokens")}
	anthropicNames = [...]quotaNames{newAnthropicNames("requests"), newAnthropicNames("tokens"),
		newAnthropicNames("input-tokens"), newAnthropicNames("output-tokens")}
)

func newOpenAINames(name string) quotaNames {
	return quotaNames{name, http.CanonicalHeaderKey("x-ratelimit-limit-" + name),
		http.CanonicalHeaderKey("x-ratelimit-remaining-" + name), http.CanonicalHeaderKey("x-ratelimit-reset-" + name), false}
}

func newAnthropicNames(name string) quotaNames {
	prefix := "anthropic-ratelimit-" + name + "-"
	return quotaNames{name, http.CanonicalHeaderKey(prefix + "limit"),
		http.CanonicalHeaderKey(prefix + "remaining"), http.CanonicalHeaderKey(prefix + "reset"), true}
}

// readMinuteQuota reads one quota of OpenAI's or Anthropic's: a minute's
// worth, that refills. A limit that is not a whole number from 1 to 2^53,
// as every count is (OpenAI sends -1 or 0), is not reported.
func readMinuteQuota(h http.Header, q quotaNames, clock *readingClock) (Reading, bool) {
	remaining, reset := h.Get(q.remaining), h.Get(q.reset)
	if remaining == "" || reset == "" {
		return Reading{}, false
	}
	r := Reading{Name: q.name, Window: time.Minute, Refills: true,
		Header: strings.ToLower(q.remaining) + ": " + remaining + ", " + strings.ToLower(q.reset) + ": " + reset}
	var ok bool
	if r.Remaining, ok = count(remaining); !ok {
		return r, false
	}
	if limit, ok := count(h.Get(q.limit)); ok && limit > 0 {
		r.Limit = limit
	}
	var err error
	if q.rfc3339 {
		var at time.Time
		at, err = time.Parse(time.RFC3339, strings.TrimSpace(reset))
		r.Reset = at.Sub(clock.at())
	} else {
		r.Reset, err = time.ParseDuration(strings.TrimSpace(reset))
	}
	return r, err == nil
}

// count reads a count of units: a whole number from 0 to 2^53.
func count(s string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n, err == nil && n >= 0 && n <= 1<<53
}

// secondsOrEpoch reads a reset in seconds (whole or decimal) from now, or,
// with epochs, a Unix time above 1,000,000,000 taken against clock
// (dated), and how much sooner it may come (see Reading.Early).
func secondsOrEpoch(s string, clock *readingClock, epochs bool) (reset, early time.Duration, dated, ok bool) {
	seconds, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(seconds) || math.IsInf(seconds, 0) || seconds < 0 {
		return 0, 0, false, false
	}
	if seconds == math.Trunc(seconds) {
		early = time.Second
	}
	if dated = epochs && seconds > 1e9; dated {
		seconds -= float64(clock.at().UnixNano()) / 1e9
		if early > 0 {
			early += clock.slack
		}
	}
	if seconds > store.MaxDelay.Seconds() {
		return 0, 0, false, false
	}
	return time.Duration(seconds * float64(time.Second)), early, dated, true
}

// sfItem is an item of a structured header list: its name and parameters.
type sfItem struct {
	name   string
	params map[string]string
}

// structuredField reads a header of the IETF draft: a list of items, each a
// name (quoted, or a token) with parameters (`"burst";r=0;t=30`), or, in the
// older form, a dictionary (`limit=100, remaining=0, reset=30`). Garbage
// yields items that the callers' checks refuse.
func structuredField(v string) ([]sfItem, map[string]string) {
	var items []sfItem
	dict := map[string]string{}
	for _, member := range strings.Split(v, ",") {
		parts := strings.Split(strings.TrimSpace(member), ";")
		if key, value, ok := strings.Cut(parts[0], "="); ok && len(parts) == 1 {
			dict[strings.ToLower(strings.TrimSpace(key))] = strings.TrimSpace(value)
			continue
		}
		item := sfItem{name: strings.Trim(strings.TrimSpace(parts[0]), `"`), params: map[string]string{}}
		for _, p := range parts[1:] {
			key, value, _ := strings.Cut(strings.TrimSpace(p), "=")
			item.params[key] = value
		}
		items = append(items, item)
	}
	return items, dict
}
