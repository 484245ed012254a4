package quotaapi

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// WarmUpHeader marks a request that only opens a connection: a Pool
// answers it with a 200 and counts it nowhere.
const WarmUpHeader = "X-Warm-Up"

// A Pool is an API of several credentials, each the bearer token in a
// request's Authorization, each held to a quota of its own (a Server's,
// whose arrivals it notes); a request with no known token is a 401. One
// credential can be made to refuse every request for a span, with a 429
// and a Retry-After, as an upstream that stops one key does.
type Pool struct {
	servers map[string]*Server // by token
	server  *http.Server
	addr    string

	mu          sync.Mutex
	refused     string // the token refused in the span, if any
	from, until time.Time
	retryAfter  string
	refusals    int
}

// StartPool starts a Pool on loopback whose tokens each have a Server of c.
func StartPool(c Config, tokens ...string) (*Pool, error) {
	p := &Pool{servers: map[string]*Server{}}
	for _, token := range tokens {
		s, err := Start(c)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.servers[token] = s
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.Close()
		return nil, err
	}
	p.addr = ln.Addr().String()
	p.server = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go p.server.Serve(ln)
	return p, nil
}

// URL is the pool's URL.
func (p *Pool) URL() string { return "http://" + p.addr + "/" }

// Close stops the pool and its servers.
func (p *Pool) Close() {
	if p.server != nil {
		p.server.Close()
	}
	for _, s := range p.servers {
		s.Close()
	}
}

// Server returns the Server of token's quota.
func (p *Pool) Server(token string) *Server { return p.servers[token] }

// Refuse makes token's requests from from until until get a 429 with
// Retry-After: retryAfter, which spends nothing.
func (p *Pool) Refuse(token string, from, until time.Time, retryAfter string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused, p.from, p.until, p.retryAfter = token, from, until, retryAfter
}

// Refusals counts the requests Refuse refused.
func (p *Pool) Refusals() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusals
}

// ServeHTTP answers a request by the quota of its token.
func (p *Pool) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(WarmUpHeader) != "" {
		return
	}
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if p.refuses(token, time.Now()) {
		w.Header().Set("Retry-After", p.retryAfter)
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	s, ok := p.servers[token]
	if !ok {
		http.Error(w, "unknown credential", http.StatusUnauthorized)
		return
	}
	s.ServeHTTP(w, r)
}

// refuses reports whether token's request at now is one Refuse refuses,
// and counts it.
func (p *Pool) refuses(token string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if token == "" || token != p.refused || now.Before(p.from) || !now.Before(p.until) {
		return false
	}
	p.refusals++
	return true
}

// CheckCarried checks that, while Refuse refused one token from from
// until until, the tokens named carried 95% at least of what their
// quotas allow at rate each, and that the refused one was asked 10 times
// at most (its first 429 and Retry-After should hold it for the fleet);
// it returns what it found, and an error when either fails.
func (p *Pool) CheckCarried(from, until time.Time, rate float64, tokens ...string) (string, error) {
	served, _ := p.Served(from, until, tokens...)
	bound := float64(len(tokens)) * rate * until.Sub(from).Seconds()
	found := fmt.Sprintf("while one token was refused for %v, the %d others served %d (%.1f%% of %.0f); the refused one was asked %d times",
		until.Sub(from), len(tokens), served, 100*float64(served)/bound, bound, p.Refusals())
	var errs []error
	if float64(served) < 0.95*bound {
		errs = append(errs, fmt.Errorf("the others served %d, want 95%% of %.0f at least", served, bound))
	}
	if p.Refusals() > 10 {
		errs = append(errs, fmt.Errorf("the refused token was asked %d times, want 10 at most: its first 429 holds it for the fleet", p.Refusals()))
	}
	return found, errors.Join(errs...)
}

// Served counts the requests of tokens that their quotas served, and
// refused, from from until to.
func (p *Pool) Served(from, to time.Time, tokens ...string) (ok, refused int) {
	for _, token := range tokens {
		for _, a := range p.servers[token].Arrivals() {
			switch {
			case a.At.Before(from) || !a.At.Before(to):
			case a.Status == http.StatusOK:
				ok++
			default:
				refused++
			}
		}
	}
	return ok, refused
}
