package fleetsim

import (
	"math"
	"time"
)

// A model is an upstream's limiter, a pure function of the arrivals and
// their times (the caller serializes them).
type model interface {
	// admit takes cost units for an arrival at now, if there are as many.
	admit(now time.Time, cost int) verdict
	// allowed is the most the upstream serves from start to end, when the
	// fleet's first arrival is at start.
	allowed(start, end time.Time) float64
}

// A verdict is an upstream's answer to one arrival, and what it says of
// its state.
type verdict struct {
	ok    bool
	left  int           // units left after it
	limit int           // units in a full bucket or window
	reset time.Duration // until the bucket is full, or the window ends
	wait  time.Duration // for a refusal: until the request would be admitted
	// window is the time limit is for, as a window states it (0 for the
	// others, whose policy states their reset)
	window time.Duration
}

// newModel returns the model of c's family.
func newModel(c Case) model {
	switch c.Upstream {
	case "nginx":
		return &nginx{rate: int64(math.Round(c.Rate * 1000)), burst: int64(c.Burst) * 1000}
	case "haproxy":
		return &haproxy{limit: int64(c.Rate), period: time.Second}
	case "window":
		return &window{count: int(c.Rate), length: c.Window, aligned: true}
	case "github":
		return &window{count: int(c.Rate), length: c.Window}
	}
	return &bucket{rate: c.Rate, size: float64(c.Burst + c.Slack), burst: c.Burst}
}

// bucket is a strict token bucket (most APIs, OpenAI's, Shopify's cost
// bucket): size tokens, full at the start, refilled at rate a second.
type bucket struct {
	rate, size float64
	burst      int // as the upstream states it: size less any slack
	tokens     float64
	last       time.Time
	started    bool
}

func (b *bucket) admit(now time.Time, cost int) verdict {
	if !b.started {
		b.tokens, b.last, b.started = b.size, now, true
	}
	b.tokens = min(b.size, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	v := verdict{limit: b.burst}
	if b.tokens >= float64(cost) {
		b.tokens -= float64(cost)
		v.ok = true
	} else {
		v.wait = seconds((float64(cost) - b.tokens) / b.rate)
	}
	v.left = int(b.tokens)
	v.reset = seconds((b.size - b.tokens) / b.rate)
	return v
}

func (b *bucket) allowed(start, end time.Time) float64 {
	return b.size + b.rate*end.Sub(start).Seconds()
}

// nginx is limit_req with nodelay (ngx_http_limit_req_module.c): in
// thousandths of a request, the excess drains at rate a second counted in
// whole milliseconds, each request adds a thousand, and a request that
// would take it above the burst is refused and not counted. The time of
// the last request moves only when a millisecond has passed.
type nginx struct {
	rate, burst int64 // thousandths of a request: a second's, and the excess allowed
	excess      int64
	last        int64 // ms
	started     bool
}

func (n *nginx) admit(now time.Time, cost int) verdict {
	ms := now.UnixMilli()
	v := verdict{limit: int(n.burst/1000) + 1}
	excess := int64(0)
	if n.started {
		elapsed := max(ms-n.last, 0)
		excess = max(n.excess-n.rate*elapsed/1000+1000, 0)
		if excess > n.burst {
			v.wait = time.Duration((excess-n.burst)*1000/n.rate) * time.Millisecond
			v.left = 0
			return v
		}
		if elapsed > 0 {
			n.last = ms
		}
	} else {
		n.started, n.last = true, ms
	}
	n.excess, v.ok = excess, true
	v.left = int((n.burst - excess) / 1000)
	v.reset = time.Duration(excess*1000/n.rate) * time.Millisecond
	return v
}

func (n *nginx) allowed(start, end time.Time) float64 {
	return float64(n.burst)/1000 + 1 + float64(n.rate)/1000*end.Sub(start).Seconds()
}

// haproxy is a stick table's http_req_rate(period) (freq_ctr.c): the
// requests of the current period plus the previous period's, weighed by
// the part of it still within the last period. Every request counts, the
// denied ones too, and one is denied while the estimate with it is above
// limit.
type haproxy struct {
	limit      int64
	period     time.Duration
	curr, prev int64
	tick       time.Time // the current period's start
	started    bool
}

func (h *haproxy) admit(now time.Time, cost int) verdict {
	if !h.started {
		h.tick, h.started = now, true
	}
	if elapsed := now.Sub(h.tick); elapsed >= h.period {
		periods := int64(elapsed / h.period)
		h.prev = h.curr
		if periods > 1 {
			h.prev = 0
		}
		h.curr = 0
		h.tick = h.tick.Add(time.Duration(periods) * h.period)
	}
	h.curr += int64(cost)
	remain := h.period - now.Sub(h.tick)
	estimate := h.curr + h.prev*int64(remain)/int64(h.period)
	v := verdict{ok: estimate <= h.limit, limit: int(h.limit), reset: remain}
	v.left = int(max(h.limit-estimate, 0))
	if !v.ok {
		v.wait = remain
	}
	return v
}

func (h *haproxy) allowed(start, end time.Time) float64 {
	return float64(h.limit) * math.Max(end.Sub(start).Seconds(), h.period.Seconds()) / h.period.Seconds()
}

// window is a fixed window of count per length: aligned ones follow each
// other from the Unix epoch (express-rate-limit's store resets them all
// together), others start at the first request after the last one ended
// (GitHub's hour).
type window struct {
	count   int
	length  time.Duration
	aligned bool
	end     time.Time // the current window's
	used    int
}

func (w *window) admit(now time.Time, cost int) verdict {
	if !now.Before(w.end) {
		w.used = 0
		w.end = now.Add(w.length)
		if w.aligned {
			w.end = now.Truncate(w.length).Add(w.length)
		}
	}
	v := verdict{limit: w.count, reset: w.end.Sub(now), window: w.length}
	if w.used+cost <= w.count {
		w.used += cost
		v.ok = true
	} else {
		v.wait = v.reset
	}
	v.left = w.count - w.used
	return v
}

func (w *window) allowed(start, end time.Time) float64 {
	first := start
	if w.aligned {
		first = start.Truncate(w.length)
	}
	return float64(w.count) * math.Ceil(end.Sub(first).Seconds()/w.length.Seconds())
}

// seconds is s seconds as a Duration, rounded up to the microsecond.
func seconds(s float64) time.Duration {
	return time.Duration(math.Ceil(s*1e6)) * time.Microsecond
}
