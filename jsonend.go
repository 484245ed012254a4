package pace

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
