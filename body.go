package pace

import (
	"errors"
	"io"
	"sync"
)

// settlingBody passes a response body through as it comes, keeping its
// first and last BodyEndSize bytes, and calls settle once, with them, when
// the body reaches EOF or is closed, whichever comes first. It holds no
// data back: each Read returns what the body's Read returned.
type settlingBody struct {
	body   io.ReadCloser
	settle func(BodyEnds)

	mu      sync.Mutex // Close may come while a Read runs
	head    []byte
	tail    []byte // the last bytes read, at most 2*BodyEndSize, trimmed to BodyEndSize when full
	settled bool
}

func (b *settlingBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keep(p[:n])
	if errors.Is(err, io.EOF) {
		b.end(true)
	}
	return n, err
}

func (b *settlingBody) Close() error {
	err := b.body.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.end(false)
	return err
}

// keep notes the bytes just read. The caller holds b.mu.
func (b *settlingBody) keep(p []byte) {
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

// end settles, once: complete says the body was read to its end. The caller
// holds b.mu.
func (b *settlingBody) end(complete bool) {
	if b.settled {
		return
	}
	b.settled = true
	b.settle(BodyEnds{Head: b.head, Tail: b.tail[max(len(b.tail)-BodyEndSize, 0):], Complete: complete})
}
