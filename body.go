package pace

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/usage"
)

// endingBody wraps resp's body, which arrived at arrival, so that, once it
// ends, its reservation (if any) is settled with what p's Settler reads of
// it, the counters it states (if p reads them: BodyCounters) reach p's
// limiter, and its slot (if any) is freed. When the Settler cannot tell,
// the reservation keeps its estimate. The settlement runs past the
// request's context: the response has been counted already. The slot lapses if the body shows no sign of
// life for a lease and is never closed, unless the caller said it always
// closes it (WithBodyAlwaysClosed). An upgraded connection's body (a
// 101's: a WebSocket) stays writable, and holds the slot until it closes.
func (p pacing) endingBody(ctx context.Context, resp *http.Response, arrival time.Time) io.ReadCloser {
	b := &endingBody{body: resp.Body, slot: p.slot, length: resp.ContentLength}
	settles, reads := p.res != nil && p.settle != nil, p.readsBody()
	if settles || reads {
		var kept bool
		b.give, kept = takeBody(ctx, 3*BodyEndSize) // past the budget, nothing kept: the estimate stands
		settles, reads = settles && kept, reads && kept
	}
	if settles {
		b.ended = new(atomic.Bool)
		runtime.AddCleanup(b, p.collected(context.WithoutCancel(ctx)), b.ended)
	}
	if settles || reads {
		ctx = context.WithoutCancel(ctx)
		b.atEnd = func(ends usage.Ends) {
			if settles {
				if actual, ok := p.settle(resp, ends); ok {
					p.backend.Settle(ctx, p.res, actual) // a failure reaches the Limiter's observer
				}
			}
			if reads {
				p.heedBody(ctx, resp, ends, arrival)
			}
		}
	}
	if !bodyAlwaysClosed(ctx) {
		p.slot.watch(time.Now())
	}
	if w, ok := resp.Body.(io.Writer); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		return upgradedBody{b, w}
	}
	return b
}

// collected returns the cleanup of a body whose reservation it settles:
// a body collected before it ended (never read to its end, never closed)
// leaves the reservation at its estimate, which the observer hears as a
// settlement that failed, with the key.
func (p pacing) collected(ctx context.Context) func(ended *atomic.Bool) {
	res, backend := p.res, p.backend
	return func(ended *atomic.Bool) {
		if !ended.Load() {
			backend.unsettled(ctx, res)
		}
	}
}

// errBodyCollected is the settlement's failure of a response body that was
// collected before it ended.
var errBodyCollected = errors.New("pace: the response's body was never read to its end nor closed: its reservation keeps its estimate; close every body")

// upgradedBody is the endingBody of an upgraded connection, which the
// client writes to as well (httputil.ReverseProxy needs it so).
type upgradedBody struct {
	*endingBody
	io.Writer
}

// endingBody passes a response body through as it comes and, once, when the
// body reaches EOF or is closed, whichever comes first: calls atEnd (when
// set) with its first and last BodyEndSize bytes, and frees slot (when
// set). Each Read is a sign of life of slot's request. It holds no data
// back: each Read returns what the body's Read returned.
type endingBody struct {
	body   io.ReadCloser
	atEnd  func(usage.Ends) // nil: nothing to settle or read, and no bytes kept
	slot   *Slot            // nil: no slot to free
	length int64            // the response's ContentLength: -1 when unknown
	give   func()           // gives the bytes kept back to their budget (see WithBodyBudget); nil for none

	mu    sync.Mutex // Close may come while a Read runs
	head  []byte
	tail  []byte // the last bytes read, at most 2*BodyEndSize, trimmed to BodyEndSize when full
	read  int64
	json  jsonEnd
	ended *atomic.Bool // set once it ended; apart, for the cleanup of a body collected before (nil: none)
	done  bool
}

func (b *endingBody) Read(p []byte) (int, error) {
	b.slot.use(true, time.Now())
	n, err := b.body.Read(p)
	b.slot.use(false, time.Now())
	b.mu.Lock()
	defer b.mu.Unlock()
	b.read += int64(n)
	if b.atEnd != nil {
		b.keep(p[:n])
		b.json.scan(p[:n])
	}
	if errors.Is(err, io.EOF) {
		b.end(true)
	}
	return n, err
}

func (b *endingBody) Close() error {
	err := b.body.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.end(false)
	return err
}

// keep notes the bytes just read. The caller holds b.mu.
func (b *endingBody) keep(p []byte) {
	if len(b.head) < BodyEndSize {
		b.head = append(b.head, p[:min(len(p), BodyEndSize-len(b.head))]...)
	}
	if len(p) >= BodyEndSize {
		b.tail = append(b.tail[:0], p[len(p)-BodyEndSize:]...)
		return
	}
	if len(b.tail)+len(p) > 2*BodyEndSize {
		b.tail = b.tail[:copy(b.tail, b.tail[len(b.tail)-BodyEndSize:])]
	}
	b.tail = append(b.tail, p...)
}

// end hands the ends on and frees the slot, once: eof says the body was read to its
// EOF; closed before it, the body is complete still when its Content-Length
// was read, or one whole JSON value. The caller holds b.mu.
func (b *endingBody) end(eof bool) {
	if b.done {
		return
	}
	b.done = true
	if b.ended != nil {
		b.ended.Store(true)
	}
	complete := eof || (b.length >= 0 && b.read >= b.length) || b.json.whole()
	if b.atEnd != nil {
		b.atEnd(usage.Ends{Head: b.head, Tail: b.tail[max(len(b.tail)-BodyEndSize, 0):], Complete: complete})
		b.head, b.tail = nil, nil
	}
	if b.give != nil {
		b.give()
	}
	b.slot.Release() // a failure reaches the Limiter's observer
}

// jsonEnd follows the bytes of a body, as they pass, far enough to tell
// whether they are one whole JSON object or array: so that a body that a
// client decoded and closed without reading its EOF (as json.Decoder does,
// over HTTP/2 above all) still counts as read to its end. It tracks nesting
// and strings only; a body that starts otherwise (an event stream) is not
// followed.
type jsonEnd struct {
	depth    int
	started  bool // the first byte that is not white space was '{' or '['
	off      bool // it was something else: not followed
	inString bool
	escaped  bool
	closed   bool // the top-level value has ended
}

// scan follows p.
func (j *jsonEnd) scan(p []byte) {
	for _, c := range p {
		switch {
		case j.off || j.closed:
			return
		case !j.started:
			switch c {
			case ' ', '\t', '\r', '\n':
			case '{', '[':
				j.started, j.depth = true, 1
			default:
				j.off = true
			}
		case j.inString:
			switch {
			case j.escaped:
				j.escaped = false
			case c == '\\':
				j.escaped = true
			case c == '"':
				j.inString = false
			}
		case c == '"':
			j.inString = true
		case c == '{' || c == '[':
			j.depth++
		case c == '}' || c == ']':
			j.depth--
			j.closed = j.depth == 0
		}
	}
}

// whole reports whether the bytes followed hold one whole object or array.
func (j *jsonEnd) whole() bool { return j.closed }
