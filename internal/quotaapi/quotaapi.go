// Package quotaapi is an API on loopback for pace's tests and examples: it
// enforces one quota strictly, answers 429 beyond it, states its counters
// in every response in the dialect of a real service, serves a foreign
// client that spends the same quota without pace, and notes every arrival.
package quotaapi

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// A Dialect is how the server states its counters.
type Dialect string

const (
	// Silent states none.
	Silent Dialect = ""
	// GitHub states x-ratelimit-limit, -remaining, -used, -reset (a Unix
	// time) and -resource ("core") of a fixed window.
	GitHub Dialect = "github"
	// IETF states RateLimit-Policy ("default";q=COUNT;w=SECONDS) and
	// RateLimit ("default";r=LEFT;t=SECONDS) of a fixed window.
	IETF Dialect = "ietf"
	// OpenAI states x-ratelimit-limit-requests (a minute's worth),
	// -remaining-requests and -reset-requests (until the bucket is full,
	// as a Go duration) of a token bucket.
	OpenAI Dialect = "openai"
	// OpenAIWindow states OpenAI's fields of a fixed window: the window's
	// count, what is left of it, and the time until it resets (as a Go
	// duration), as gateways in front of LLM APIs state theirs.
	OpenAIWindow Dialect = "openai-window"
	// Gateway states x-ratelimit-limit (its burst), -remaining and -reset
	// (until the bucket is full, in whole seconds, rounded up) of a token
	// bucket, as API gateways state theirs in GitHub's fields.
	Gateway Dialect = "gateway"
	// GatewayUnix is Gateway with the reset the Unix time the bucket is
	// full, rounded up to the next second, as GitHub states its resets.
	GatewayUnix Dialect = "gateway-unix"
	// Shopify answers every request 200, as Shopify's GraphQL Admin API
	// does, with the bucket (Burst points, restored at Rate a second, each
	// request Cost) in its body's extensions.cost.throttleStatus, and a
	// refusal as errors[].extensions.code THROTTLED; its Arrival notes a
	// refusal as a 429.
	Shopify Dialect = "shopify"
)

// ParseDialect reads a dialect's name: "github", "ietf", "openai",
// "openai-window", "gateway", "gateway-unix", "shopify" or "".
func ParseDialect(s string) (Dialect, error) {
	switch d := Dialect(s); d {
	case Silent, GitHub, IETF, OpenAI, OpenAIWindow, Gateway, GatewayUnix, Shopify:
		return d, nil
	}
	return Silent, fmt.Errorf("dialect %q: want github, ietf, openai, openai-window, gateway, gateway-unix or shopify", s)
}

// Windowed reports whether the dialect counts a fixed window, rather than a
// token bucket.
func (d Dialect) Windowed() bool { return d == GitHub || d == IETF || d == OpenAIWindow }

// Config is what a server enforces and says.
type Config struct {
	Dialect Dialect
	// Rate and Burst are the token bucket that Silent, OpenAI and the Gateways enforce;
	// a Rate of 0 enforces none.
	Rate  float64
	Burst int
	// Slack is tokens the bucket holds beyond Burst that its counters do
	// not state: room for the jitter of arrivals, as the fleet's burst at
	// the start reaches it in any order.
	Slack int
	// Count per Window is the fixed window that the windowed dialects enforce;
	// windows follow each other from WindowsFrom on (the Unix epoch when
	// zero).
	Window      time.Duration
	Count       int
	WindowsFrom time.Time
	// Once, when its At is set, is the answer the server gives its first
	// request after At instead of the quota's, such as a 429 with
	// Retry-After: 1. It spends nothing, and its counters say what the
	// quota has left, as a service's do when another of its parts refuses.
	Once Once
	// RetryAfter, when set, is the Retry-After every refusal of the quota
	// carries, as most real APIs send one with each 429.
	RetryAfter string
	// Service is how long the server takes to answer a request, which is
	// in flight meanwhile (see Counts.MaxInFlight).
	Service time.Duration
	// Cost is what each request takes of the bucket (1 when 0); the
	// foreign client's take 1.
	Cost int
}

// Once is one answer: its status and one header.
type Once struct {
	At            time.Time
	Status        int
	Header, Value string
}

// GrantedAtHeader carries, in a request, the UnixNano time pace granted it;
// the server notes it in the request's Arrival.
const GrantedAtHeader = "X-Granted-At"

// An Arrival is a request the server answered.
type Arrival struct {
	At      time.Time
	Granted time.Time // from GrantedAtHeader; zero without one
	Status  int
	Foreign bool // from the foreign client
	Left    int  // the units left after it
}

// Server is the API. Its methods are safe for concurrent use.
type Server struct {
	config Config
	server *http.Server
	addr   string

	mu       sync.Mutex
	bucket   *rate.Limiter
	window   int64 // the fixed window counted, from the Unix epoch
	used     int   // in that window
	spoke    bool  // Once was said
	arrivals []Arrival
	counts   Counts
	inFlight int
	foreign  sync.WaitGroup
	closed   chan struct{} // closed by Close: the foreign clients stop
}

// Start starts a server of c on loopback.
func Start(c Config) (*Server, error) {
	switch {
	case c.Dialect.Windowed() && (c.Window <= 0 || c.Count <= 0):
		return nil, fmt.Errorf("dialect %s counts a window: want a positive Window and Count, not %v and %d", c.Dialect, c.Window, c.Count)
	case !c.Dialect.Windowed() && (c.Rate < 0 || (c.Rate > 0 && c.Burst <= 0)):
		return nil, fmt.Errorf("dialect %q paces a bucket: want a Rate of 0 or more and a positive Burst, not %v and %d", c.Dialect, c.Rate, c.Burst)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if c.WindowsFrom.IsZero() {
		c.WindowsFrom = time.Unix(0, 0)
	}
	s := &Server{config: c, addr: ln.Addr().String(), window: -1, closed: make(chan struct{})}
	if c.Rate > 0 && !c.Dialect.Windowed() {
		s.bucket = rate.NewLimiter(rate.Limit(c.Rate), c.Burst+c.Slack)
	}
	s.server = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go s.server.Serve(ln)
	return s, nil
}

// URL is the server's URL.
func (s *Server) URL() string { return "http://" + s.addr + "/" }

// Close stops the server and the foreign clients, and waits for them.
func (s *Server) Close() {
	close(s.closed)
	s.server.Close()
	s.foreign.Wait()
}

// ServeHTTP answers a request: 200 within the quota, else 429, with the
// counters of the dialect.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var a Arrival
	if granted, err := strconv.ParseInt(r.Header.Get(GrantedAtHeader), 10, 64); err == nil {
		a.Granted = time.Unix(0, granted)
	}
	defer s.serving()()
	a = s.take(a, w.Header())
	if s.config.Dialect == Shopify {
		s.answerAsShopify(w, a)
		return
	}
	w.WriteHeader(a.Status)
	if a.Status == http.StatusOK {
		fmt.Fprintf(w, "ok, %d left\n", a.Left)
	}
}

// answerAsShopify answers a as Shopify's GraphQL Admin API does: 200, the
// bucket in the body, THROTTLED when a was refused.
func (s *Server) answerAsShopify(w http.ResponseWriter, a Arrival) {
	w.Header().Set("Content-Type", "application/json")
	answer := `"data": {"shop": {"name": "quotaapi"}}`
	if a.Status != http.StatusOK {
		answer = `"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED", "documentation": "https://shopify.dev/api/usage/rate-limits"}}]`
	}
	fmt.Fprintf(w, `{%s, "extensions": {"cost": {"requestedQueryCost": %d, "actualQueryCost": %d, "throttleStatus": {"maximumAvailable": %d.0, "currentlyAvailable": %d, "restoreRate": %g}}}}`,
		answer, max(s.config.Cost, 1), max(s.config.Cost, 1), s.config.Burst, a.Left, s.config.Rate)
}

// serving counts a request in flight until the server has taken its
// Service time, and returns the func that counts it out.
func (s *Server) serving() (done func()) {
	s.mu.Lock()
	s.inFlight++
	s.counts.MaxInFlight = max(s.counts.MaxInFlight, s.inFlight)
	s.mu.Unlock()
	time.Sleep(s.config.Service)
	return func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}
}

// Spend makes the foreign client spend n units now, as it can.
func (s *Server) Spend(n int) {
	for range n {
		s.take(Arrival{Foreign: true}, nil)
	}
}

// StartForeign starts a foreign client that spends one unit every 1/perSecond,
// until stop is called (which waits for it).
func (s *Server) StartForeign(perSecond float64) (stop func()) {
	done := make(chan struct{})
	tick := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
	s.foreign.Go(func() {
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-s.closed:
				return
			case <-tick.C:
				s.take(Arrival{Foreign: true}, nil)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		s.foreign.Wait()
	}
}

// SetRate changes the bucket's rate from now on, and what the OpenAI
// dialect advertises.
func (s *Server) SetRate(perSecond float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.config.Rate = perSecond
	if s.bucket != nil {
		s.bucket.SetLimit(rate.Limit(perSecond))
	}
}

// Counts are the requests a server answered, by client and answer, and the
// most it served at once.
type Counts struct {
	OK, Refused, ForeignOK, ForeignRefused int
	MaxInFlight                            int
}

// Counts returns the requests answered so far.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// Arrivals returns every arrival so far, in order.
func (s *Server) Arrivals() []Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Arrival(nil), s.arrivals...)
}

// take spends a unit for the arrival a, if the quota has one, notes it with
// its time, status and the units left, and writes the dialect's counters to
// h (when not nil). The time is taken under the lock, so that arrivals are
// counted in the order of their times.
func (s *Server) take(a Arrival, h http.Header) Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	a.At = time.Now()
	now, c := a.At, s.config
	a.Status = http.StatusOK
	if c.Dialect.Windowed() {
		if w := int64(now.Sub(c.WindowsFrom) / c.Window); w != s.window {
			s.window, s.used = w, 0
		}
	}
	switch once := !c.Once.At.IsZero() && !s.spoke && now.After(c.Once.At) && !a.Foreign; {
	case once:
		s.spoke, a.Status = true, c.Once.Status
		if h != nil {
			h.Set(c.Once.Header, c.Once.Value)
		}
	case c.Dialect.Windowed() && s.used < c.Count:
		s.used++
	case c.Dialect.Windowed():
		a.Status = http.StatusTooManyRequests
	case s.bucket != nil && !s.bucket.AllowN(now, s.costOf(a)):
		a.Status = http.StatusTooManyRequests
	}
	if a.Status == http.StatusTooManyRequests && c.RetryAfter != "" && h != nil {
		h.Set("Retry-After", c.RetryAfter)
	}
	switch {
	case c.Dialect.Windowed():
		a.Left = c.Count - s.used
	case s.bucket != nil:
		a.Left = int(max(min(s.bucket.TokensAt(now), float64(c.Burst)), 0)) // the slack unstated
	}
	if h != nil {
		s.state(now, a.Left, h)
	}
	s.arrivals = append(s.arrivals, a)
	switch ok := a.Status == http.StatusOK; {
	case a.Foreign && ok:
		s.counts.ForeignOK++
	case a.Foreign:
		s.counts.ForeignRefused++
	case ok:
		s.counts.OK++
	default:
		s.counts.Refused++
	}
	return a
}

// costOf is what a takes of the bucket: the configured Cost, 1 for the
// foreign client's.
func (s *Server) costOf(a Arrival) int {
	if a.Foreign {
		return 1
	}
	return max(s.config.Cost, 1)
}

// state writes the counters of the dialect, left units left at now.
func (s *Server) state(now time.Time, left int, h http.Header) {
	c := s.config
	end := c.WindowsFrom.Add(time.Duration(s.window+1) * c.Window)
	switch c.Dialect {
	case GitHub:
		h.Set("X-RateLimit-Limit", strconv.Itoa(c.Count))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(left))
		h.Set("X-RateLimit-Used", strconv.Itoa(c.Count-left))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(end.UnixNano())/1e9)), 10))
		h.Set("X-RateLimit-Resource", "core")
	case IETF:
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%d`, c.Count, int64(math.Ceil(c.Window.Seconds()))))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, left, int64(math.Ceil(end.Sub(now).Seconds()))))
	case OpenAI:
		if s.bucket != nil {
			h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(int(math.Round(c.Rate*60))))
			h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(left))
			h.Set("X-Ratelimit-Reset-Requests", s.untilFull(now).Round(time.Millisecond).String())
		}
	case OpenAIWindow:
		h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(c.Count))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(left))
		h.Set("X-Ratelimit-Reset-Requests", end.Sub(now).Round(time.Millisecond).String())
	case Gateway, GatewayUnix:
		if s.bucket != nil {
			full := s.untilFull(now)
			reset := math.Ceil(full.Seconds())
			if c.Dialect == GatewayUnix {
				reset = math.Ceil(float64(now.Add(full).UnixNano()) / 1e9)
			}
			h.Set("X-RateLimit-Limit", strconv.Itoa(c.Burst))
			h.Set("X-RateLimit-Remaining", strconv.Itoa(left))
			h.Set("X-RateLimit-Reset", strconv.FormatInt(int64(reset), 10))
		}
	}
}

// untilFull is the time from now until the bucket is full.
func (s *Server) untilFull(now time.Time) time.Duration {
	c := s.config
	return time.Duration(max(float64(c.Burst)-s.bucket.TokensAt(now), 0) / c.Rate * float64(time.Second))
}
