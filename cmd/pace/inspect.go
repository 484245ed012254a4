package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	layout "github.com/fleetpace/pace/internal/store" // the Redis keys pace keeps
)

// A part is one Redis key of pace's, as inspect reports it: the key it
// belongs to (its hash tag), what it is, and what it says now.
type part struct {
	tag    string // the key a user named, or "fleet" for the fleets' heartbeats
	redis  string // the Redis key
	suffix string // what follows the tag in it
	kind   string
	state  string
	count  int // of the marks a "settled" part counts
}

// scanner is a Redis node inspect scans: a client, or each master of a
// cluster.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// runInspect runs pace inspect: the report of what pace keeps in Redis,
// per key, once.
func runInspect(ctx context.Context, args []string, out, errOut io.Writer) error {
	return inspectCommand(ctx, "inspect", args, out, errOut)
}

// runWatch runs pace watch: the report of pace inspect, again and again.
func runWatch(ctx context.Context, args []string, out, errOut io.Writer) error {
	return inspectCommand(ctx, "watch", args, out, errOut)
}

// inspectCommand reads the flags of pace inspect, or watch (with -every),
// and writes the report, once or every -every until ctx ends.
func inspectCommand(ctx context.Context, name string, args []string, out, errOut io.Writer) error {
	flags := newFlags(name, errOut)
	target := redisFlags(flags)
	known := limits{}
	flags.Var(known, "limit", "a limit as pace.ParseLimit reads it, TEXT for a quota of one unnamed limit or NAME=TEXT for a named one, so that the report says what is left (again for each)")
	asJSON := flags.Bool("json", false, "write the report as JSON")
	every := time.Duration(0)
	if name == "watch" {
		flags.DurationVar(&every, "every", time.Second, "how often to refresh")
	}
	if err := flags.Parse(args); err != nil {
		return err
	}
	if name == "watch" && every <= 0 {
		return fmt.Errorf("-every %v: want a positive duration", every)
	}
	client, err := target.connect()
	if err != nil {
		return err
	}
	defer client.Close()
	for {
		if every > 0 {
			fmt.Fprint(out, "\033[H\033[2J")
		}
		if err := inspect(ctx, out, client, *target.prefix, flags.Args(), known, *asJSON); err != nil || every == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

// inspect reads every key of pace's under prefix (only those of keys, when
// given; see matches) on each node, and writes a report per key to w, as
// JSON when asJSON. Its reads are bounded (no command reads a whole large
// key) and pipelined, readBatch keys at a time; a key whose data is not
// pace's, or that expires meanwhile, says so on its own line, and the
// report goes on.
func inspect(ctx context.Context, w io.Writer, c redis.UniversalClient, prefix string, keys []string, known limits, asJSON bool) error {
	now, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	names, err := scan(ctx, c, prefix, keys)
	if err != nil {
		return err
	}
	var parts []part
	for batch := range slices.Chunk(names, readBatch) {
		read, err := readParts(ctx, c, prefix, batch, known, now)
		if err != nil {
			return err
		}
		parts = append(parts, read...)
	}
	if asJSON {
		return writeJSON(w, now, countMarks(parts))
	}
	write(w, now, countMarks(parts))
	return nil
}

// scan returns the sorted names of pace's keys under prefix (only those
// of keys, when given), on every master of a cluster.
func scan(ctx context.Context, c redis.UniversalClient, prefix string, keys []string) ([]string, error) {
	var names []string
	var err error
	if cluster, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex // ForEachMaster calls at once
		err = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			found, err := scanNode(ctx, node, prefix, keys)
			mu.Lock()
			defer mu.Unlock()
			names = append(names, found...)
			return err
		})
	} else {
		names, err = scanNode(ctx, c, prefix, keys)
	}
	slices.Sort(names)
	return names, err
}

// readBatch is how many keys inspect reads in one round trip.
const readBatch = 500

// scanNode returns the names of pace's keys on node, those of keys alone
// when given (see matches): SCAN, never KEYS, so that Redis is never
// blocked.
func scanNode(ctx context.Context, node scanner, prefix string, keys []string) ([]string, error) {
	var names []string
	for cursor := uint64(0); ; {
		found, next, err := node.Scan(ctx, cursor, escape(prefix)+"{*", 1000).Result()
		if err != nil {
			return nil, err
		}
		for _, name := range found {
			if len(keys) == 0 || slices.ContainsFunc(keys, func(k string) bool { return matches(newPart(prefix, name).tag, k) }) {
				names = append(names, name)
			}
		}
		if cursor = next; cursor == 0 {
			return names, nil
		}
	}
}

// matches says whether a key's tag is one an operator named as k: the
// tag itself ("api.github.com:443"), a rule's name, whose keys begin with
// it and a bar ("github" for "github|api.github.com:443|9f86..."), or a
// host of a rule's keys, with or without its port ("api.github.com").
func matches(tag, k string) bool {
	if tag == k {
		return true
	}
	if inner, _, pooled := strings.Cut(strings.TrimPrefix(tag, "{"), "}"); pooled && strings.HasPrefix(tag, "{") {
		return matches(inner, k) // a pool's credential of the key
	}
	segments := strings.Split(tag, "|")
	if len(segments) < 2 {
		return false
	}
	if segments[0] == k {
		return true
	}
	host, _, _ := strings.Cut(segments[1], ":")
	return segments[1] == k || host == k || strings.Trim(host, "[]") == k
}

// escape escapes the glob characters of s for SCAN's MATCH.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// readParts reads the keys names, under prefix, at now, in two round
// trips: their types, then what each needs. A command's error belongs to
// its key; readParts fails only when Redis cannot be reached.
func readParts(ctx context.Context, c redis.UniversalClient, prefix string, names []string, known limits, now time.Time) ([]part, error) {
	parts := make([]part, len(names))
	types := make([]*redis.StatusCmd, len(names))
	pipe := c.Pipeline()
	for i, name := range names {
		parts[i] = newPart(prefix, name)
		types[i] = pipe.Type(ctx, name)
	}
	if _, err := pipe.Exec(ctx); unreachable(err) {
		return nil, err
	}
	pipe = c.Pipeline()
	finish := make([]func() error, len(names))
	for i := range parts {
		typ, err := types[i].Result()
		switch {
		case err != nil:
			parts[i].failed(err)
		case typ == "none":
			parts[i].state = "gone: it expired during the report"
		default:
			finish[i] = plan(ctx, pipe, &parts[i], typ, known, now)
		}
	}
	if _, err := pipe.Exec(ctx); unreachable(err) {
		return nil, err
	}
	for i, f := range finish {
		if f == nil {
			continue
		}
		if err := f(); err != nil {
			parts[i].failed(err)
		}
	}
	return parts, nil
}

// unreachable says whether err, a pipeline's, is more than one of its
// commands' own: Redis could not be reached.
func unreachable(err error) bool {
	var redisErr redis.Error
	return err != nil && !errors.Is(err, redis.Nil) && !errors.As(err, &redisErr)
}

// newPart is the part of the Redis key name, under prefix, before it is
// read: its tag and, in kind, what its suffix says it is.
func newPart(prefix, name string) part {
	rest := strings.TrimPrefix(name, prefix+"{")
	end := strings.Index(rest, "}")
	if end < 0 {
		return part{tag: "?", redis: name, kind: "unknown"}
	}
	if strings.HasPrefix(rest, "{") { // a pool's credential: {{KEY}NAME}
		if close := strings.Index(rest[end+1:], "}"); close >= 0 {
			end += 1 + close
		}
	}
	return part{tag: rest[:end], redis: name, suffix: rest[end+1:]}
}

// failed says, on p's line, that reading it failed with err.
func (p *part) failed(err error) {
	if errors.Is(err, redis.Nil) {
		p.state = "gone: it expired during the report"
		return
	}
	p.state = "cannot be read: " + strconv.Quote(err.Error())
}

// maxRead is the most of a string inspect reads: pace's strings are a few
// numbers.
const maxRead = 1024

// plan queues on pipe the bounded reads p needs, by its suffix and its
// Redis type typ (and, for a limit's key, its limit, when known), and returns what makes p's state of their replies once
// pipe has run (nil when p needs no read).
func plan(ctx context.Context, pipe redis.Pipeliner, p *part, typ string, known limits, now time.Time) func() error {
	suffix := p.suffix
	var want string // the type pace keeps there
	var finish func() error
	switch {
	case p.kind == "unknown":
		return nil
	case p.tag == layout.FleetTag && strings.HasPrefix(suffix, "#"):
		p.kind, want = "fleet "+strconv.Quote(strings.TrimPrefix(suffix, "#")), "zset"
		finish = readFleet(ctx, pipe, p, now)
	case strings.HasPrefix(suffix, layout.HoldSuffix):
		p.kind, want = "hold", "string"
		finish = readString(ctx, pipe, p, func(text string) string { return "held until " + since(text, now) })
	case strings.HasPrefix(suffix, layout.LimitsSuffix):
		p.kind, want = "limits", "string"
		finish = readString(ctx, pipe, p, func(text string) string { return limitsState(text, now) })
	case strings.HasPrefix(suffix, layout.DifferSuffix):
		p.kind, want = "limits differ", "string"
		finish = readString(ctx, pipe, p, func(string) string { return "the fleet paces the key at different limits: every booking reads them" })
	case strings.HasPrefix(suffix, layout.RateSuffix):
		p.kind, want = "rate after refusals", "string"
		finish = readString(ctx, pipe, p, func(text string) string { return rateState(text, now) })
	case strings.HasPrefix(suffix, layout.DeferredSuffix):
		p.kind, want = "deferred", "string"
		finish = readString(ctx, pipe, p, func(text string) string { return "the line of deferred requests ends " + since(text, now) })
	case strings.Contains(suffix, layout.GapsSuffix):
		p.kind, want = "gaps", "zset"
		n := pipe.ZCard(ctx, p.redis)
		finish = func() error {
			p.state = fmt.Sprintf("%d bookings given back with later ones behind them", n.Val())
			return n.Err()
		}
	case strings.HasPrefix(suffix, layout.SettledSuffix):
		p.kind, p.state = "settled", "a "+marks["settled"].one
		return nil
	case strings.HasPrefix(suffix, layout.CallSuffix):
		p.kind, p.state = "call", "a "+marks["call"].one
		return nil
	case strings.HasPrefix(suffix, layout.SlotsSuffix), strings.HasPrefix(suffix, layout.WaitersSuffix), strings.HasPrefix(suffix, layout.LineSuffix):
		want = "zset"
		finish = readSlots(ctx, pipe, p, now)
	default:
		return planLimit(ctx, pipe, p, typ, known, now)
	}
	if typ != want {
		p.state = fmt.Sprintf("a %s, where pace keeps a %s: not pace's", typ, want)
		return nil
	}
	return finish
}

// shownMembers is how many members of a set inspect shows, at most.
const shownMembers = 10

// more says how many of n were not shown, when shown were.
func more(n, shown int) string {
	if n > shown {
		return fmt.Sprintf(" and %d more", n-shown)
	}
	return ""
}

// readString plans the read of the first maxRead bytes of p's string,
// whose state says is then.
func readString(ctx context.Context, pipe redis.Pipeliner, p *part, says func(text string) string) func() error {
	text := pipe.GetRange(ctx, p.redis, 0, maxRead-1)
	return func() error {
		if text.Err() == nil {
			p.state = says(text.Val())
		}
		return text.Err()
	}
}

// rateState reads a key's rate after refusals: "EDGE BOTTOM CUT ...", in
// parts per million of the configured rate and microseconds of Redis's
// clock (see pace's lua/rate.lua).
func rateState(text string, now time.Time) string {
	var edge, bottom float64
	var cut string
	if _, err := fmt.Sscanf(text, "%f %f %s", &edge, &bottom, &cut); err != nil {
		return strconv.Quote(text) + ", not pace's"
	}
	if bottom >= 1e6 {
		return fmt.Sprintf("opened by a refusal %s: evenly at the configured rate, the refusals weighed", since(cut, now))
	}
	return fmt.Sprintf("cut to %.1f%% of the configured rate %s, climbing to %.1f%%, what the upstream was found to accept", bottom/1e4, since(cut, now), edge/1e4)
}

// limitsState reads the limits the processes of a fleet pace a key of one
// bucket at: "A B UNTIL OA OB OUNTIL", the strictest standing and another,
// by interval (microseconds) and burst, each until its time (see pace's
// lua/limits.lua).
func limitsState(text string, now time.Time) string {
	var f [6]int64
	if _, err := fmt.Sscanf(text, "%d %d %d %d %d %d", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]); err != nil || f[0] <= 0 || f[3] < 0 {
		return strconv.Quote(text) + ", not pace's"
	}
	state := fmt.Sprintf("the fleet paces it at %s (it lapses %s)", bucketText(f[0], f[1]), since(strconv.FormatInt(f[2], 10), now))
	if f[3] > 0 {
		state += fmt.Sprintf("; another process asks %s (it lapses %s): they disagree", bucketText(f[3], f[4]), since(strconv.FormatInt(f[5], 10), now))
	}
	return state
}

// bucketText says what a bucket of interval (microseconds) and burst
// lets go.
func bucketText(interval, burst int64) string {
	return fmt.Sprintf("one every %v, burst %d", time.Duration(interval)*time.Microsecond, burst)
}

// readSlots plans the read of the slots of a cap in flight, its line or
// its waiters: how many, and the first and last leases.
func readSlots(ctx context.Context, pipe redis.Pipeliner, p *part, now time.Time) func() error {
	what, name, _ := strings.Cut(strings.TrimPrefix(p.suffix, "#"), ":")
	p.kind = map[string]string{"slots": "slots of ", "line": "line of ", "waiters": "waiters of "}[what] + strconv.Quote(name)
	n, first, last := pipe.ZCard(ctx, p.redis), pipe.ZRangeWithScores(ctx, p.redis, 0, 0), pipe.ZRangeWithScores(ctx, p.redis, -1, -1)
	return func() error {
		count := n.Val()
		switch what {
		case "slots":
			p.state = fmt.Sprintf("%d held", count)
			if z := first.Val(); len(z) > 0 {
				p.state += ", leases end " + since(strconv.FormatFloat(z[0].Score, 'f', 0, 64), now)
			}
			if z := last.Val(); count > 1 && len(z) > 0 {
				p.state += " to " + since(strconv.FormatFloat(z[0].Score, 'f', 0, 64), now)
			}
		case "line":
			p.state = fmt.Sprintf("%d waiting", count)
		default:
			p.state = fmt.Sprintf("%d leases", count)
		}
		return errors.Join(n.Err(), first.Err(), last.Err())
	}
}

// readFleet plans the read of a fleet's heartbeats: how many members, and
// the latest shownMembers of them.
func readFleet(ctx context.Context, pipe redis.Pipeliner, p *part, now time.Time) func() error {
	n, latest := pipe.ZCard(ctx, p.redis), pipe.ZRevRangeWithScores(ctx, p.redis, 0, shownMembers-1)
	return func() error {
		var lines []string
		for _, m := range latest.Val() {
			lines = append(lines, fmt.Sprintf("%q, last heartbeat %s", fmt.Sprint(m.Member), since(strconv.FormatFloat(m.Score, 'f', 0, 64), now)))
		}
		p.state = fmt.Sprintf("%d members", n.Val())
		if len(lines) > 0 {
			p.state += ": " + strings.Join(lines, "; ") + more(int(n.Val()), len(lines))
		}
		return errors.Join(n.Err(), latest.Err())
	}
}

// since says when the time text (microseconds of Redis's clock) lies from
// now: "in 1.2s" or "0.4s ago".
func since(text string, now time.Time) string {
	us, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return strconv.Quote(text) + ", not a time"
	}
	d := time.UnixMicro(us).Sub(now).Round(time.Millisecond)
	if d < 0 {
		return (-d).String() + " ago"
	}
	return "in " + d.String()
}

// marks are the kinds of keys pace keeps one of per request, which inspect
// counts: what one is and what several are.
var marks = map[string]struct{ one, several string }{
	"settled": {"settled reservation's mark", "settled reservations' marks"},
	"call":    {"booking's call record, kept until it is due", "bookings' call records, each kept until it is due"},
}

// countMarks replaces the marks of one kind beneath a key, one Redis key
// each, by one line that counts them.
func countMarks(parts []part) []part {
	var out []part
	for _, p := range parts {
		m, isMark := marks[p.kind]
		if last := len(out) - 1; isMark && last >= 0 && out[last].kind == p.kind && out[last].tag == p.tag {
			out[last].count++
			out[last].state = fmt.Sprintf("%d %s", out[last].count, m.several)
			continue
		}
		if isMark {
			p.count, p.redis, p.state = 1, p.redis[:len(p.redis)-len(p.suffix)]+p.suffix[:strings.Index(p.suffix, ":")+1]+"*", "1 "+m.one
		}
		out = append(out, p)
	}
	return out
}

// write writes parts, grouped by key.
func write(w io.Writer, now time.Time, parts []part) {
	fmt.Fprintf(w, "Redis time %s, %d keys\n", now.UTC().Format(time.RFC3339Nano), len(parts))
	tag := "\x00"
	for _, p := range parts {
		if p.tag != tag {
			tag = p.tag
			fmt.Fprintf(w, "\n%q\n", tag)
		}
		fmt.Fprintf(w, "  %-42q %-22s %s\n", p.redis, p.kind, p.state)
	}
}

// writeJSON writes parts as one JSON object, for scripts.
func writeJSON(w io.Writer, now time.Time, parts []part) error {
	type key struct {
		Key      string `json:"key"`
		RedisKey string `json:"redis_key"`
		Kind     string `json:"kind"`
		State    string `json:"state"`
	}
	report := struct {
		RedisTime time.Time `json:"redis_time"`
		Keys      []key     `json:"keys"`
	}{RedisTime: now.UTC(), Keys: []key{}}
	for _, p := range parts {
		report.Keys = append(report.Keys, key{p.tag, p.redis, p.kind, p.state})
	}
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(report)
}
