package pace

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/fleetpace/pace/internal/httptoken"
)

// A matcher is a rule's match fields, checked: the host in lower case
// without its brackets, the port if the Host named one, the method in
// upper case. An empty field matches every request.
type matcher struct{ host, port, prefix, method string }

// newMatcher checks r's match fields, and returns them as a matcher. A
// field that could match no request is an error that names it.
func newMatcher(r Rule) (matcher, error) {
	host, port, err := splitRuleHost(r.Host)
	if err != nil {
		return matcher{}, fmt.Errorf("pace: rule %q: Host %q %s", r.Name, r.Host, err.Error())
	}
	switch {
	case r.PathPrefix != "" && !strings.HasPrefix(r.PathPrefix, "/"):
		return matcher{}, fmt.Errorf("pace: rule %q: PathPrefix %q does not begin with a slash, as every path does", r.Name, r.PathPrefix)
	case strings.ContainsAny(r.PathPrefix, "?#"):
		return matcher{}, fmt.Errorf("pace: rule %q: PathPrefix %q has a query or fragment, which no path has", r.Name, r.PathPrefix)
	case r.Method != "" && !httptoken.Valid(r.Method):
		return matcher{}, fmt.Errorf("pace: rule %q: Method %q is not a method", r.Name, r.Method)
	}
	return matcher{host: host, port: port, prefix: r.PathPrefix, method: strings.ToUpper(r.Method)}, nil
}

// splitRuleHost returns a Rule's Host as a host in lower case and its
// port, if it has one, or says why it is no host.
func splitRuleHost(h string) (host, port string, err error) {
	switch {
	case h == "":
		return "", "", nil
	case strings.Contains(h, "://"):
		return "", "", errors.New(`has a scheme: want a host alone, such as "api.example.com", or a host and port`)
	case strings.ContainsAny(h, "/?#@ \t\r\n"):
		return "", "", errors.New(`is not a host: want a host such as "api.example.com", or a host and port`)
	}
	if host, port, err = net.SplitHostPort(h); err != nil {
		host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), ""
		if strings.Contains(host, ":") && net.ParseIP(host) == nil {
			return "", "", fmt.Errorf("is not a host, nor a host and port: %w", err)
		}
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("has port %q: want 1 to 65535", port)
	}
	if host == "" {
		return "", "", errors.New("has no host")
	}
	return strings.ToLower(host), port, nil
}

// matches says whether req, whose path the upstream reads as path
// (upstreamPath), is a request m matches.
func (m *matcher) matches(req *http.Request, path string) bool {
	return (m.host == "" || strings.EqualFold(m.host, req.URL.Hostname())) &&
		(m.port == "" || m.port == portOf(req)) &&
		(m.prefix == "" || strings.HasPrefix(path, m.prefix)) &&
		(m.method == "" || strings.EqualFold(m.method, req.Method))
}

// upstreamPath is p, decoded, as an upstream that collapses empty segments
// and resolves dot segments reads it ("/v1/%2Fsearch" and "/v1/x/../search"
// are "/v1/search"), its trailing slash kept: a rule's PathPrefix matches
// the endpoint the request reaches, however it is spelled.
func upstreamPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	clean := path.Clean(p) // p itself when it is clean: no allocation
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// validHeaderName says whether name is empty or a header's name.
func validHeaderName(name string) bool { return name == "" || httptoken.Valid(name) }
