package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetpace/pace"
)

// Result is what one run measured.
type Result struct {
	Case    Case
	Served  int     // units the upstream served
	Allowed float64 // units it allowed in the run, as far as pace's limit allowed them too
	// Demand is the units the fleet's workers could have sent with no
	// limiter at all, each request its round trip to the upstream: below
	// Allowed, the run says little of pace's loops.
	Demand float64
	// Refused counts the upstream's refusals; RefusedAfter1s those after
	// the run's first second.
	Refused, RefusedAfter1s int
	// OthersServed and OthersRefused count the requests of the client
	// outside the fleet (see Case.Others) that the upstream served and
	// refused: what it served is not the fleet's to spend.
	OthersServed, OthersRefused int
	// PerSecond is the units the upstream served the fleet in each second
	// of the run.
	PerSecond   []int
	Errors      int           // requests that failed before they were sent
	RedisCalls  int           // the processes' calls to Redis, heartbeats' pipelines aside
	LongestWait time.Duration // the longest a request waited to be sent
	// FirstHold is how long, within the run, the first hold the upstream
	// asked for lasted (0 for none): a limit above the upstream's is
	// refused once before the fleet can know, and a Retry-After of a
	// second holds a run of three for a third of it.
	FirstHold  time.Duration
	Violations []string // the invariants broken, each with what led to it
	Trace      []string // the arrivals and events in order, for a reader and a replay
}

// Utilisation is the share of what the upstream allowed that it served.
func (r Result) Utilisation() float64 {
	if r.Allowed == 0 {
		return 0
	}
	return float64(r.Served) / r.Allowed
}

// Run runs c in a synctest bubble of its own: a new virtual clock, the
// store, the network and the fleet, all gone when it returns.
func Run(t *testing.T, c Case) Result {
	t.Helper()
	var res Result
	synctest.Test(t, func(t *testing.T) { res = run(t, c) })
	return res
}

// A sim is one run in progress.
type sim struct {
	c      Case
	limit  pace.Limit
	start  time.Time
	end    time.Time
	up     *upstream
	redis  *redisServer
	faults *faults

	calls    calls // how long Redis's answers took
	mu       sync.Mutex
	events   []event
	attempts int
	unsent   int              // requests that failed before they were sent
	waits    []span           // each request's, from its RoundTrip to its send
	trips    map[string]trips // each worker's round trips to the upstream
	failures []string         // requests that broke an invariant
}

// since is t as a time into the run.
func (s *sim) since(t time.Time) time.Duration { return t.Sub(s.start) }

// waited notes a request's wait.
func (s *sim) waited(from, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waits = append(s.waits, span{from, until})
}

// trips are a worker's round trips to the upstream: how many, and how
// long they took in all.
type trips struct {
	n    int
	took time.Duration
}

// tripped notes a round trip of worker's to the upstream.
func (s *sim) tripped(worker string, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.trips[worker]
	t.n, t.took = t.n+1, t.took+took
	s.trips[worker] = t
}

// demand is what the workers could have sent in the run with no limiter
// at all, each request its round trip to the upstream (a worker that sent
// none could have sent anything).
func (s *sim) demand() float64 {
	if len(s.trips) < s.c.Procs*s.c.Workers {
		return math.Inf(1)
	}
	var units float64
	for _, t := range s.trips {
		if t.took <= 0 {
			return math.Inf(1)
		}
		units += float64(t.n*s.c.Cost) * s.c.Duration.Seconds() / t.took.Seconds()
	}
	return units
}

// An event is one of a limiter's events, with its time and process.
type event struct {
	at   time.Time
	proc int
	pace.Event
}

// sendsKey is the context key of a request's count of its sends.
type sendsKey struct{}

// workerHeader names, in a simulated request, the worker that sent it.
const workerHeader = "X-Fleetsim-Worker"

// startHeader carries, in a simulated request, when its worker began it
// (UnixNano), so that the route measures its wait.
const startHeader = "X-Fleetsim-Start"

func run(t *testing.T, c Case) Result {
	limit, err := c.paceLimit()
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{c: c, limit: limit, start: time.Now(), calls: calls{failing: make(map[string]time.Time)}, trips: map[string]trips{}}
	s.end = s.start.Add(c.Duration)
	s.faults = newFaults(c, s.start)
	s.up = newUpstream(c, s.faults)
	if s.redis, err = newRedisServer(c, s.faults); err != nil {
		t.Fatal(err)
	}
	s.scheduleRestarts()
	s.sendOthers()
	var closers []func()
	var workers sync.WaitGroup
	for p := range c.Procs {
		transport, closeProc, err := s.process(p)
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, closeProc)
		for w := range c.Workers {
			workers.Go(func() { s.work(transport, fmt.Sprintf("%d.%d", p, w)) })
		}
	}
	workers.Wait()
	for _, closeProc := range closers {
		closeProc()
	}
	s.redis.close()
	synctest.Wait()
	return s.result()
}

// scheduleRestarts empties the store where the fault says: a killed Redis
// comes back empty; a failover's new primary lacks what the old one had.
func (s *sim) scheduleRestarts() {
	switch s.c.Faults {
	case "kill":
		time.AfterFunc(time.Until(s.faults.from), s.redis.kill)
		time.AfterFunc(time.Until(s.faults.until), s.redis.store.FlushAll)
	case "flush":
		time.AfterFunc(time.Until(s.faults.from), func() {
			s.redis.store.FlushAll()
			s.redis.kill()
		})
	}
}

// process builds process p as a user would: its own go-redis client (with
// the options pace recommends) and Redis limiter, as one pace.Process,
// and a Transport over its route to the upstream.
func (s *sim) process(p int) (http.RoundTripper, func(), error) {
	client := redis.NewClient(&redis.Options{
		Addr:                     "redis:6379",
		Dialer:                   s.redis.dialer(p),
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		// go-redis draws each retry's backoff from math/rand's global
		// source, which no seed decides: equal bounds make it its
		// default's least, 8 ms, every time, and a run whose Redis is
		// killed replays.
		MinRetryBackoff: 8 * time.Millisecond,
		MaxRetryBackoff: 8 * time.Millisecond,
	})
	client.AddHook(stagger{link: newRedisLink(s.c, 0), proc: "sim-" + strconv.Itoa(p), calls: &s.calls})
	limiter, err := pace.NewRedis(client, s.limit,
		pace.WithProcess(pace.NewNamedProcess("sim-"+strconv.Itoa(p))), pace.WithMaxHold(s.c.MaxHold), pace.WithTokenLeases(s.c.Leases == "on"),
		pace.WithObserver(func(_ context.Context, e pace.Event) { s.note(p, e) }))
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	t := &pace.Transport{
		Base:    &route{up: s.up, proc: p, out: newLink(s.c, uint64(3+2*p)), back: newLink(s.c, uint64(4+2*p)), sim: s},
		Limiter: limiter,
		Key:     func(*http.Request) string { return "api" },
		Cost:    func(*http.Request) int { return s.c.Cost },
	}
	if s.c.Body == "shopify" {
		t.BodyCounters = pace.ShopifyCounters
	}
	return t, func() { limiter.Close(); client.Close() }, nil
}

func (s *sim) note(p int, e pace.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, event{at: time.Now(), proc: p, Event: e})
}

// errorPause is the least a worker waits after a failed request.
const errorPause = 10 * time.Millisecond

// work sends one request after another through t until the run ends, each
// under the run's end as its deadline. Its requests carry its name, which
// their trips on the network hash. After a refusal it waits as a patient
// caller does (a loop that fails at once would spin at one instant of the
// virtual clock).
func (s *sim) work(t http.RoundTripper, name string) {
	for time.Now().Before(s.end) {
		err := s.send(t, name)
		var refused *pace.DeadlineError
		switch {
		case err == nil:
			continue
		case errors.As(err, &refused):
			time.Sleep(max(errorPause, min(refused.Delay, time.Until(s.end))))
			continue
		case !errors.Is(err, context.DeadlineExceeded):
			s.failed(fmt.Sprintf("at %v a request failed: %v", s.since(time.Now()), err))
		}
		time.Sleep(errorPause)
	}
}

// send sends one request through t, reads its answer whole, and counts
// it: sent once, or failed before it was sent.
func (s *sim) send(t http.RoundTripper, name string) error {
	ctx, cancel := context.WithDeadline(context.Background(), s.end)
	defer cancel()
	sends := new(atomic.Int32)
	ctx = context.WithValue(context.WithValue(ctx, sendsKey{}, sends), workerKey{}, name)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/", nil)
	req.Header.Set(startHeader, strconv.FormatInt(time.Now().UnixNano(), 10))
	req.Header.Set(workerHeader, name)
	resp, err := t.RoundTrip(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	switch n := sends.Load(); {
	case n > 1:
		s.failed(fmt.Sprintf("bookings: a request was sent %d times", n))
	case n == 0 && err == nil:
		s.failed("bookings: a request was answered but never sent")
	case n == 0:
		s.mu.Lock()
		s.unsent++
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.attempts++
	s.mu.Unlock()
	return err
}

// failed notes a request that broke an invariant.
func (s *sim) failed(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, why)
}
