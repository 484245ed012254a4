package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A part is one Redis key of pace's, as inspect reports it: the key it
// belongs to (its hash tag), what it is, and what it says now.
type part struct {
	tag   string // the key a user named, or "fleet" for the fleets' heartbeats
	redis string // the Redis key
	kind  string
	state string
}

// scanner is a Redis node inspect scans: a client, or each master of a
// cluster.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// inspect reads every key of pace's under prefix (only those of keys, when
// given) on each node, and writes a report per key to w.
func inspect(ctx context.Context, w io.Writer, c redis.UniversalClient, prefix string, keys []string) error {
	now, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	var names []string
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
	if err != nil {
		return err
	}
	slices.Sort(names)
	var parts []part
	for _, name := range names {
		p, err := read(ctx, c, prefix, name, now)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	write(w, now, parts)
	return nil
}

// scanNode returns the names of pace's keys on node: SCAN, never KEYS, so
// that Redis is never blocked.
func scanNode(ctx context.Context, node scanner, prefix string, keys []string) ([]string, error) {
	patterns := []string{escape(prefix) + "{*"}
	if len(keys) > 0 {
		patterns = nil
		for _, k := range keys {
			patterns = append(patterns, escape(prefix+"{"+k+"}")+"*")
		}
	}
	var names []string
	for _, pattern := range patterns {
		for cursor := uint64(0); ; {
			found, next, err := node.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return nil, err
			}
			names = append(names, found...)
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return names, nil
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

// read reads the Redis key name, under prefix, at now.
func read(ctx context.Context, c redis.UniversalClient, prefix, name string, now time.Time) (part, error) {
	rest := strings.TrimPrefix(name, prefix+"{")
	end := strings.Index(rest, "}")
	if end < 0 {
		return part{tag: "?", redis: name, kind: "unknown"}, nil
	}
	p := part{tag: rest[:end], redis: name}
	suffix := rest[end+1:]
	typ, err := c.Type(ctx, name).Result()
	if err != nil {
		return p, err
	}
	switch {
	case p.tag == "fleet" && strings.HasPrefix(suffix, "#"):
		return readFleet(ctx, c, p, strings.TrimPrefix(suffix, "#"), now)
	case strings.HasPrefix(suffix, "#hold"):
		return readTime(ctx, c, p, "hold", "held until", now)
	case strings.HasPrefix(suffix, "#rate"):
		return readRate(ctx, c, p, now)
	case strings.HasPrefix(suffix, "#deferred"):
		return readTime(ctx, c, p, "deferred", "the line of deferred requests ends", now)
	case strings.Contains(suffix, "#gaps"):
		n, err := c.ZCard(ctx, name).Result()
		p.kind, p.state = "gaps", fmt.Sprintf("%d bookings given back with later ones behind them", n)
		return p, err
	case strings.HasPrefix(suffix, "#settled:"):
		p.kind, p.state = "settled", "a settled reservation's mark"
		return p, nil
	case strings.HasPrefix(suffix, "#slots:"), strings.HasPrefix(suffix, "#waiters:"), strings.HasPrefix(suffix, "#line:"):
		return readSlots(ctx, c, p, suffix, now)
	}
	return readLimit(ctx, c, p, typ, now)
}

// readLimit reads the key of a limit: a bucket's schedule (a string), a
// sliding window's grants (a sorted set), a fixed window's counts (a hash).
func readLimit(ctx context.Context, c redis.UniversalClient, p part, typ string, now time.Time) (part, error) {
	switch typ {
	case "string":
		text, err := c.Get(ctx, p.redis).Result()
		if err != nil {
			return p, err
		}
		fields := strings.Fields(text)
		p.kind = "bucket"
		if len(fields) > 1 {
			p.kind = "bucket, steered by the upstream's counters"
		}
		p.state = "schedule booked until " + since(fields[0], now) + " (a new request waits that, less burst - 1 intervals)"
		return p, nil
	case "zset":
		grants, err := c.ZRangeWithScores(ctx, p.redis, 0, -1).Result()
		if err != nil || len(grants) == 0 {
			return p, err
		}
		p.kind = "sliding window"
		p.state = fmt.Sprintf("%d grants kept, the oldest %s", len(grants), since(strconv.FormatFloat(grants[0].Score, 'f', 0, 64), now))
		return p, nil
	case "hash":
		counts, err := c.HGetAll(ctx, p.redis).Result()
		p.kind = "fixed window"
		var windows []string
		for window, used := range counts {
			windows = append(windows, "window "+window+": "+used+" used")
		}
		slices.Sort(windows)
		p.state = strings.Join(windows, ", ")
		return p, err
	}
	p.kind, p.state = typ, "not pace's"
	return p, nil
}

// readTime reads a key that holds one time, in microseconds of Redis's clock.
func readTime(ctx context.Context, c redis.UniversalClient, p part, kind, what string, now time.Time) (part, error) {
	text, err := c.Get(ctx, p.redis).Result()
	p.kind, p.state = kind, what+" "+since(text, now)
	return p, err
}

// readRate reads a key's rate after refusals: "EDGE BOTTOM CUT HEARD
// TAT", in parts per million of the configured rate and microseconds of
// Redis's clock (see pace's internal/store/lua/rate.lua).
func readRate(ctx context.Context, c redis.UniversalClient, p part, now time.Time) (part, error) {
	text, err := c.Get(ctx, p.redis).Result()
	p.kind = "rate after refusals"
	var edge, bottom float64
	var cut string
	if _, scanErr := fmt.Sscanf(text, "%f %f %s", &edge, &bottom, &cut); scanErr != nil {
		p.state = strconv.Quote(text) + ", not pace's"
		return p, err
	}
	p.state = fmt.Sprintf("cut to %.1f%% of the configured rate %s, climbing to 3%% below %.1f%%, where the upstream refused", bottom/1e4, since(cut, now), edge/1e4)
	return p, err
}

// readSlots reads the slots of a cap in flight, its line or its waiters.
func readSlots(ctx context.Context, c redis.UniversalClient, p part, suffix string, now time.Time) (part, error) {
	members, err := c.ZRangeWithScores(ctx, p.redis, 0, -1).Result()
	if err != nil {
		return p, err
	}
	switch {
	case strings.HasPrefix(suffix, "#slots:"):
		p.kind = "slots of " + strings.TrimPrefix(suffix, "#slots:")
		p.state = fmt.Sprintf("%d held", len(members))
		if len(members) > 0 {
			p.state += ", leases end " + since(strconv.FormatFloat(members[0].Score, 'f', 0, 64), now)
		}
		if len(members) > 1 {
			p.state += " to " + since(strconv.FormatFloat(members[len(members)-1].Score, 'f', 0, 64), now)
		}
	case strings.HasPrefix(suffix, "#line:"):
		p.kind, p.state = "line of "+strings.TrimPrefix(suffix, "#line:"), fmt.Sprintf("%d waiting", len(members))
	default:
		p.kind, p.state = "waiters of "+strings.TrimPrefix(suffix, "#waiters:"), fmt.Sprintf("%d leases", len(members))
	}
	return p, nil
}

// readFleet reads the heartbeats of the fleet name.
func readFleet(ctx context.Context, c redis.UniversalClient, p part, name string, now time.Time) (part, error) {
	members, err := c.ZRangeWithScores(ctx, p.redis, 0, -1).Result()
	p.kind = "fleet " + name
	var lines []string
	for _, m := range members {
		lines = append(lines, fmt.Sprintf("%v, last heartbeat %s", m.Member, since(strconv.FormatFloat(m.Score, 'f', 0, 64), now)))
	}
	p.state = fmt.Sprintf("%d members", len(members))
	if len(lines) > 0 {
		p.state += ": " + strings.Join(lines, "; ")
	}
	return p, err
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

// write writes parts, grouped by key.
func write(w io.Writer, now time.Time, parts []part) {
	fmt.Fprintf(w, "Redis time %s, %d keys\n", now.UTC().Format(time.RFC3339Nano), len(parts))
	tag := "\x00"
	for _, p := range parts {
		if p.tag != tag {
			tag = p.tag
			fmt.Fprintf(w, "\n%s\n", tag)
		}
		fmt.Fprintf(w, "  %-40s %-22s %s\n", p.redis, p.kind, p.state)
	}
}
