package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Paths are resolved before anything decides on them: a route's match,
// its rules' and the upstream's path. An upstream may decode what the
// proxy passes on encoded (%2e%2e, %2f) and resolve it: a path that a
// prefix seemed to hold, with the route's API key added, would then leave
// the upstream's base path; and a rule's path would be dodged by a
// variant (//search, /./search, /x/../search).

// resolvePath resolves the dot segments of p, an escaped path from its
// slash (RFC 3986, 5.2.4), their dots encoded or not, and makes doubled
// slashes one. It refuses a path that climbs above its root, one whose
// escapes do not decode, and one that hides a dot segment behind an
// encoded slash or a backslash, which an upstream may take for a slash.
func resolvePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q: want a path from its slash", truncate(p))
	}
	segments := strings.Split(p[1:], "/")
	out := make([]string, 0, len(segments))
	trailing := false
	for i, s := range segments {
		last := i == len(segments)-1
		decoded, err := url.PathUnescape(s)
		if err != nil {
			return "", fmt.Errorf("path %q: %w", truncate(p), err)
		}
		switch {
		case decoded == "" || decoded == ".":
			trailing = last
		case decoded == "..":
			if len(out) == 0 {
				return "", fmt.Errorf("path %q: climbs above its root", truncate(p))
			}
			out, trailing = out[:len(out)-1], last
		case hidesDotSegment(decoded):
			return "", fmt.Errorf("path %q: a dot segment behind an encoded slash or a backslash", truncate(p))
		default:
			out, trailing = append(out, s), false
		}
	}
	resolved := "/" + strings.Join(out, "/")
	if trailing && len(out) > 0 {
		resolved += "/"
	}
	return resolved, nil
}

// hidesDotSegment reports whether a decoded segment holds a dot segment
// between slashes or backslashes.
func hidesDotSegment(decoded string) bool {
	for _, piece := range strings.FieldsFunc(decoded, func(r rune) bool { return r == '/' || r == '\\' }) {
		if piece == "." || piece == ".." {
			return true
		}
	}
	return false
}

// resolveRequestPath resolves r's path (resolvePath) in place.
func resolveRequestPath(r *http.Request) error {
	escaped := r.URL.EscapedPath()
	resolved, err := resolvePath(escaped)
	if err != nil || resolved == escaped {
		return err
	}
	r.URL.Path, _ = url.PathUnescape(resolved) // it decoded, segment by segment
	r.URL.RawPath = resolved
	return nil
}
