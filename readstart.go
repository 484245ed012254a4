package pace

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"

	"github.com/fleetpace/pace/headers"
)

// startRead is a response body whose start a Transport read to hear what
// it says (see paced.heed): that start, then the rest, as they came. held
// says the start asked for a hold, which NewRetryClient's policy heeds.
type startRead struct {
	io.Reader
	body  io.ReadCloser
	start []byte
	held  bool
}

func (b *startRead) Close() error { return b.body.Close() }

// readStart reads the start of resp's body, up to headers.BodySize (less
// when the body ends sooner or fails), and puts in its place a body that
// reads it all as it came.
func readStart(resp *http.Response) *startRead {
	start, err := io.ReadAll(io.LimitReader(resp.Body, headers.BodySize))
	rest := io.Reader(resp.Body)
	if err != nil {
		rest = errReader{err}
	}
	b := &startRead{Reader: io.MultiReader(bytes.NewReader(start), rest), body: resp.Body, start: start}
	resp.Body = b
	return b
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
