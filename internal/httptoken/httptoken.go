// Package httptoken tells a token of HTTP (RFC 9110, 5.6.2), as a method
// and a header's name are: pace's rules and pace serve's config check
// theirs with it.
package httptoken

import "strings"

// Valid reports whether s is a token: one or more of the letters, digits
// and !#$%&'*+-.^_`|~.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
