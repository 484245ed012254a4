package main

import (
	"net/url"
	"strings"
	"testing"
)

// TestResolvePath: paths as clients send them, dot segments encoded or
// not, in any case, behind doubled slashes, or hidden behind an encoded
// slash or a backslash: resolved, or refused when they climb above the
// root or hide a dot segment.
func TestResolvePath(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/chat/completions":           "/api/v1/chat/completions",
		"/api/":                              "/api/",
		"/api//search":                       "/api/search",
		"/api/./search":                      "/api/search",
		"/api/x/../search":                   "/api/search",
		"/api/%2e/search":                    "/api/search",
		"/api/x/%2e%2e/search":               "/api/search",
		"/api/x/%2E%2E/search":               "/api/search",
		"/api/x/.%2e/search":                 "/api/search",
		"/api/x/..":                          "/api/",
		"/api/projects/group%2Fproject/jobs": "/api/projects/group%2Fproject/jobs", // an encoded slash in a name stays
		"/api/a%20b":                         "/api/a%20b",
		"/api/%2e%2e/%2e%2e/etc/passwd":      "", // climbs above the root
		"/api/../../etc/passwd":              "",
		"/..":                                "",
		"/api/%2e%2e%2f%2e%2e%2fetc":         "", // a dot segment behind an encoded slash
		"/api/..%2F..%2Fetc":                 "",
		"/api/..%5c..%5cetc":                 "", // behind a backslash
		"/api/%zz":                           "", // no escape
		"api/x":                              "", // not from its slash
	} {
		got, err := resolvePath(path)
		if want == "" {
			if err == nil {
				t.Errorf("%s: resolved to %s, want an error", path, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", path, got, err, want)
		}
	}
}

// FuzzResolvePath: whatever the path, a resolved one holds no dot segment,
// however its segments decode, no doubled slash, and resolves to itself.
func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"/api/x/../y", "/api/%2e%2e/%2e%2e/etc", "/a//b/./c/", "/a/..%2f..%2fb", "/a%2Fb/%2E"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		resolved, err := resolvePath(path)
		if err != nil {
			return
		}
		if strings.Contains(resolved, "//") {
			t.Fatalf("%q resolved to %q: a doubled slash", path, resolved)
		}
		for _, segment := range strings.Split(resolved, "/") {
			decoded, err := url.PathUnescape(segment)
			if err != nil {
				t.Fatalf("%q resolved to %q: segment %q does not decode", path, resolved, segment)
			}
			for _, piece := range strings.FieldsFunc(decoded, func(r rune) bool { return r == '/' || r == '\\' }) {
				if piece == "." || piece == ".." {
					t.Fatalf("%q resolved to %q: a dot segment in %q", path, resolved, segment)
				}
			}
		}
		if again, err := resolvePath(resolved); err != nil || again != resolved {
			t.Fatalf("%q resolved to %q, which resolves to %q, %v", path, resolved, again, err)
		}
	})
}
