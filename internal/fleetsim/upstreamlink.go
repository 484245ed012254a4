package fleetsim

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// An arrival is one request at the upstream.
type arrival struct {
	sent, at time.Time // when the Transport sent it (its grant), when it arrived
	proc     int
	cost     int
	ok       bool
}

// upstream is the simulated API: c's model behind a link from each
// process, noting every request.
type upstream struct {
	c      Case
	model  model
	faults *faults

	mu       sync.Mutex
	arrivals []arrival
	others   []arrival // the requests of a client outside the fleet (see Case.Others)
	sends    int
	answers  []heard // refusals that asked for a hold, as their processes heard them
}

// heard is a refusal's answer reaching its process, and the hold it asked
// for.
type heard struct {
	at   time.Time
	hold time.Duration
}

func newUpstream(c Case, f *faults) *upstream {
	return &upstream{c: c, model: newModel(c), faults: f}
}

// A route is one process's way to the upstream: its http.RoundTripper.
type route struct {
	up        *upstream
	proc      int
	out, back *link
	sim       *sim

	mu        sync.Mutex
	connected map[string]bool // the workers whose connection is open
}

// connect is what a trip of worker who adds: the case's Connect on its
// first, when its connection opens.
func (r *route) connect(who string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.connected[who] {
		return 0
	}
	if r.connected == nil {
		r.connected = map[string]bool{}
	}
	r.connected[who] = true
	return r.up.c.Connect
}

// RoundTrip takes the request to the model and its answer back, each way
// a trip of its link.
func (r *route) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := time.Now()
	if began, err := strconv.ParseInt(req.Header.Get(startHeader), 10, 64); err == nil {
		r.sim.waited(time.Unix(0, began), sent)
	}
	if n, ok := req.Context().Value(sendsKey{}).(*atomic.Int32); ok {
		n.Add(1)
	}
	r.up.mu.Lock()
	r.up.sends++
	r.up.mu.Unlock()
	who := req.Header.Get(workerHeader)
	if err := sleep(req.Context(), r.up.faults.paused(sent, r.proc)+r.connect(who)+r.out.trip(sent, []byte(who))); err != nil {
		return nil, err
	}
	resp, hold := r.up.arrive(req, sent, r.proc)
	back := time.Now()
	if err := sleep(req.Context(), r.up.faults.paused(back, r.proc)+r.back.trip(back, []byte(who))); err != nil {
		return nil, err
	}
	if hold > 0 {
		r.up.mu.Lock()
		r.up.answers = append(r.up.answers, heard{at: time.Now(), hold: hold})
		r.up.mu.Unlock()
	}
	r.sim.tripped(who, time.Since(sent))
	return resp, nil
}

// arrive judges a request at the model, notes it, and answers it; hold is
// what a refusal's Retry-After or body asks.
func (u *upstream) arrive(req *http.Request, sent time.Time, proc int) (*http.Response, time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	v := u.model.admit(now, u.c.Cost)
	u.arrivals = append(u.arrivals, arrival{sent: sent, at: now, proc: proc, cost: u.c.Cost, ok: v.ok})
	var hold time.Duration
	if ra, _ := u.c.retryAfter(v.wait); !v.ok && ra != "" && u.c.Body != "shopify" {
		n, _ := strconv.Atoi(ra)
		hold = time.Duration(n) * time.Second
	}
	if !v.ok && u.c.Body == "retryinfo" {
		hold = max(hold, v.wait)
	}
	return answer(u.c, v, now, req), hold
}
