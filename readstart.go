package pace

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/headers"
)

// startRead is a response body whose start a Transport reads to hear what
// it says (see pacing.heed): that start, then the rest, as they came. The
// start is read on a goroutine of its own, so that a body that trickles
// does not hold the status (see within); reads wait for it. held says the
// start asked for a hold, which NewRetryClient's policy heeds.
type startRead struct {
	body    io.ReadCloser
	done    chan struct{} // closed once start and rest are set
	start   []byte
	rest    io.Reader
	held    atomic.Bool
	release sync.Once
	give    func() // gives the start's bytes back to their budget
}

func (b *startRead) Read(p []byte) (int, error) {
	<-b.done
	return b.rest.Read(p)
}

func (b *startRead) Close() error {
	err := b.body.Close()
	b.release.Do(b.give)
	return err
}

// readStart begins to read the start of resp's body, up to
// headers.BodySize (less when the body ends sooner or fails), and puts in
// its place a body that reads it all as it came; closed, it calls give.
func readStart(resp *http.Response, give func()) *startRead {
	b := &startRead{body: resp.Body, done: make(chan struct{}), give: give}
	go func() {
		start, err := io.ReadAll(io.LimitReader(b.body, headers.BodySize))
		rest := io.Reader(b.body)
		if err != nil {
			rest = errReader{err}
		}
		b.start, b.rest = start, io.MultiReader(bytes.NewReader(start), rest)
		close(b.done)
	}()
	resp.Body = b
	return b
}

// within reports whether the start has been read within d: a refusal's
// body comes with its status, or it is heard once it comes (see
// pacing.heed), and the status goes on meanwhile.
func (b *startRead) within(d time.Duration) bool {
	select {
	case <-b.done:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-b.done:
		return true
	case <-t.C:
		return false
	}
}

// errReader fails every Read with err: the error a body's read met, passed
// on after what it read.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// decoded returns what start, the start of a body in the content encoding
// named, says: gzip and deflate (zlib's, or raw) decoded as far as start
// goes, up to headers.BodySize; start itself in any other encoding, which
// the hearing then finds no hold in. A proxy passes the client's
// Accept-Encoding on, so a refusal's body may come compressed.
func decoded(start []byte, encoding string) []byte {
	var r io.Reader
	var err error
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "gzip", "x-gzip":
		r, err = gzip.NewReader(bytes.NewReader(start))
	case "deflate":
		if r, err = zlib.NewReader(bytes.NewReader(start)); err != nil {
			r, err = flate.NewReader(bytes.NewReader(start)), nil
		}
	default:
		return start
	}
	if err != nil {
		return nil
	}
	out, _ := io.ReadAll(io.LimitReader(r, headers.BodySize)) // what decodes before the start ends
	return out
}
