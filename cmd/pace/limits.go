package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
	layout "github.com/fleetpace/pace/internal/store" // the Redis keys pace keeps
)

// limits are the limits inspect is told of (-limit TEXT, or NAME=TEXT), by
// the name a limit goes by in its Redis key: "" for the key of a quota of
// one unnamed bucket (pace:{KEY}). A limit named by its own text, as an
// AllOf's unnamed limits are (pace:{KEY}:5/m sliding), needs none.
type limits map[string]pace.Limit

// String returns the limits as -limit takes them.
func (ls limits) String() string {
	var texts []string
	for name, l := range ls {
		if name != "" {
			texts = append(texts, name+"="+l.String())
		} else {
			texts = append(texts, l.String())
		}
	}
	slices.Sort(texts)
	return strings.Join(texts, " ")
}

// Set reads one -limit: TEXT, or NAME=TEXT, TEXT as pace.ParseLimit reads it.
func (ls limits) Set(v string) error {
	name, text, named := strings.Cut(v, "=")
	if !named {
		name, text = "", v
	}
	l, err := pace.ParseLimit(text)
	if err != nil {
		return err
	}
	ls[name] = l
	return nil
}

// of returns the limit of a limit's key whose suffix (after its tag) is
// suffix, and whether it is known.
func (ls limits) of(suffix string) (pace.Limit, bool) {
	name := strings.TrimPrefix(suffix, ":")
	if l, ok := ls[name]; ok {
		return l, true
	}
	if name == "" {
		return pace.Limit{}, false
	}
	l, err := pace.ParseLimit(name)
	return l, err == nil
}

// planLimit plans the read of a limit's key: a bucket's schedule (a
// string), a sliding window's grants (a sorted set), a fixed window's
// counts (a hash). With its limit known, it says what is left now and
// how long a new request of one would wait.
func planLimit(ctx context.Context, pipe redis.Pipeliner, p *part, typ string, known limits, now time.Time) func() error {
	l, ok := known.of(p.suffix)
	switch typ {
	case "string":
		p.kind = "bucket"
		return readString(ctx, pipe, p, func(text string) string { return bucketState(p, text, l, ok, now) })
	case "zset":
		p.kind = "sliding window"
		return planSliding(ctx, pipe, p, l, ok, now)
	case "hash":
		p.kind = "fixed window"
		return planFixed(ctx, pipe, p, l, ok, now)
	}
	p.kind, p.state = strconv.Quote(typ), "not pace's"
	return nil
}

// bucketState says what a bucket's value text says at now: its schedule
// and, for a bucket the upstream's counters steered, their readings; with
// its limit l (known), the tokens left and a new request's wait.
func bucketState(p *part, text string, l pace.Limit, known bool, now time.Time) string {
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return strconv.Quote(text) + ", not pace's"
	}
	tat, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return strconv.Quote(fields[0]) + ", not a time: not pace's"
	}
	state := "schedule booked until " + since(fields[0], now)
	if known {
		interval := 1e6 / l.Rate() // µs a token
		ahead := max(float64(tat-now.UnixMicro()), 0)
		burst := float64(l.Burst())
		wait := time.Duration(max(ahead-(burst-1)*interval, 0)) * time.Microsecond
		state = fmt.Sprintf("limit %s: %d of %d tokens left, a new request waits %v; %s", l, int(max(math.Floor(burst-ahead/interval), 0)), l.Burst(), wait.Round(time.Millisecond), state)
	}
	if len(fields) == layout.SteeredFields {
		p.kind = "bucket, steered by the upstream's counters"
		state += "; " + readings(fields, now)
	}
	return state
}

// readings says what a steered bucket's fields (see pace's
// lua/common.lua) hold of the upstream's counters: the
// units its last response said were left, until when they are spread, and
// the rate the upstream advertised.
func readings(fields []string, now time.Time) string {
	var till, spread, learned, left int64
	for i, v := range map[int]*int64{2: &till, 3: &spread, 4: &learned, 5: &left} {
		*v, _ = strconv.ParseInt(fields[i], 10, 64)
	}
	out := fmt.Sprintf("the upstream said %d left", left)
	if till > 0 {
		out += fmt.Sprintf(", spread %v apart until %s", (time.Duration(spread) * time.Microsecond).Round(time.Millisecond), since(fields[2], now))
	}
	if learned > 0 {
		out += fmt.Sprintf(", and advertised %.4g a second", 1e6/float64(learned))
	}
	return out
}

// planSliding plans the read of a sliding window's grants: how many it
// keeps and the oldest; with its limit l (known), how many fall in the
// window now, and a new request's wait.
func planSliding(ctx context.Context, pipe redis.Pipeliner, p *part, l pace.Limit, known bool, now time.Time) func() error {
	n, oldest := pipe.ZCard(ctx, p.redis), pipe.ZRangeWithScores(ctx, p.redis, 0, 0)
	var in *redis.IntCmd
	var first *redis.ZSliceCmd
	period := int64(float64(l.Burst()) / l.Rate() * 1e6)
	from := strconv.FormatInt(now.UnixMicro()-period, 10)
	if known {
		in = pipe.ZCount(ctx, p.redis, "("+from, "+inf")
		first = pipe.ZRangeByScoreWithScores(ctx, p.redis, &redis.ZRangeBy{Min: "(" + from, Max: "+inf", Count: 1})
	}
	return func() error {
		p.state = fmt.Sprintf("%d grants kept", n.Val())
		if z := oldest.Val(); len(z) > 0 {
			p.state += ", the oldest " + since(strconv.FormatFloat(z[0].Score, 'f', 0, 64), now)
		}
		if !known {
			return errors.Join(n.Err(), oldest.Err())
		}
		left, wait := int64(l.Burst())-in.Val(), time.Duration(0)
		if z := first.Val(); left <= 0 && len(z) > 0 {
			wait = time.Duration(int64(z[0].Score)+period-now.UnixMicro()) * time.Microsecond
		}
		p.state = fmt.Sprintf("limit %s: %d of %d left, a new request waits %v; %s", l, max(left, 0), l.Burst(), max(wait, 0).Round(time.Millisecond), p.state)
		return errors.Join(n.Err(), oldest.Err(), in.Err(), first.Err())
	}
}

// planFixed plans the read of a fixed window's counts: a few windows and
// how many; with its limit l (known), the count of the current window,
// and a new request's wait.
func planFixed(ctx context.Context, pipe redis.Pipeliner, p *part, l pace.Limit, known bool, now time.Time) func() error {
	n, some := pipe.HLen(ctx, p.redis), pipe.HScan(ctx, p.redis, 0, "", shownMembers)
	var current *redis.StringCmd
	start, reset := l.Window(now)
	if known {
		current = pipe.HGet(ctx, p.redis, windowField(l, start))
	}
	return func() error {
		fields, _ := some.Val()
		var windows []string
		for i := 0; i+1 < len(fields) && len(windows) < shownMembers; i += 2 {
			windows = append(windows, "window "+strconv.Quote(fields[i])+": "+strconv.Quote(fields[i+1])+" used")
		}
		slices.Sort(windows)
		p.state = strings.Join(windows, ", ") + more(int(n.Val()), len(windows))
		if !known {
			return errors.Join(n.Err(), some.Err())
		}
		used, err := current.Int64()
		if errors.Is(err, redis.Nil) {
			used, err = 0, nil
		}
		left, wait := int64(l.Burst())-used, time.Duration(0)
		if left <= 0 {
			wait = reset.Sub(now)
		}
		p.state = fmt.Sprintf("limit %s: %d of %d left in this window, which resets at %s, a new request waits %v; %s",
			l, max(left, 0), l.Burst(), reset.In(cmp.Or(l.Zone(), time.UTC)).Format(time.RFC3339), wait.Round(time.Millisecond), p.state)
		return errors.Join(n.Err(), some.Err(), err)
	}
}

// windowField is the field of a fixed window's counts for its window that
// starts at start: a calendar's by its start, in microseconds of the Unix
// epoch; another's by its number from the epoch (see window_at in
// lua/common.lua).
func windowField(l pace.Limit, start time.Time) string {
	if l.Zone() != nil {
		return strconv.FormatInt(start.UnixMicro(), 10)
	}
	_, end := l.Window(start)
	return strconv.FormatInt(start.UnixMicro()/end.Sub(start).Microseconds(), 10)
}
