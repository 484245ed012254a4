package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestServeReloadRoutes: a reload serves a new route and drops a removed
// one from the next request on, keeps the route whose configuration did
// not change (its limiters and their state), and lets a request under way
// on a removed route end as it began, then closes that route. A configuration that does not read,
// or changes what a route cannot (Redis, a new address), is refused with
// an error that says why, and the routes before it serve on.
func TestServeReloadRoutes(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/slow") {
			close(arrived)
			<-release
		}
		io.WriteString(w, r.URL.Path)
	}))
	defer upstream.Close()
	route := func(name string) string {
		return fmt.Sprintf("  - {name: %s, path: /%s/, upstream: '%s/%s', limit: 1000/s}\n", name, name, upstream.URL, name)
	}
	head := "listen: 127.0.0.1:0\nroutes:\n"
	s, base := startServe(t, head+route("a")+route("b"))
	path := filepath.Join(t.TempDir(), "serve.yaml")
	reload := func(config string) error {
		t.Helper()
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		return s.reload(path)
	}
	get := func(p string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	slow := make(chan int)
	go func() {
		status, _ := get("/b/slow")
		slow <- status
	}()
	<-arrived
	kept := s.table.Load().routes[0]
	if err := reload(head + route("a") + route("c")); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if routes := s.table.Load().routes; routes[0] != kept {
		t.Error("route a, unchanged, was built anew: its limiters' state is lost")
	}
	for p, want := range map[string]int{"/a/x": 200, "/b/x": 404, "/c/x": 200} {
		if status, body := get(p); status != want {
			t.Errorf("GET %s after the reload: %d %q, want %d", p, status, body, want)
		}
	}
	if built := s.builtRoutes(); len(built) != 3 {
		t.Errorf("with a request under way on route b, %d routes open, want 3 (a, b and c)", len(built))
	}
	close(release)
	if status := <-slow; status != http.StatusOK {
		t.Errorf("the request under way on route b, which the reload removed: %d, want it to end as it began (200)", status)
	}
	for deadline := time.Now().Add(5 * time.Second); len(s.builtRoutes()) != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after its last request ended, route b, which the reload removed, is open still (%d routes open)", len(s.builtRoutes()))
		}
	}

	for name, tc := range map[string]struct{ config, want string }{
		"unreadable":    {head + "  - {name: a, upstream: 'x', limit: fast}\n", `limit: pace: invalid limit "fast"`},
		"another redis": {"redis: redis://127.0.0.1:1\n" + head + route("a"), "take a restart"},
		"a new address": {head + strings.Replace(route("c"), "{name: c,", "{name: c, listen: '127.0.0.1:1',", 1), "listen 127.0.0.1:1: a new address takes a restart"},
	} {
		if err := reload(tc.config); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: reload: %v, want an error with %q", name, err, tc.want)
		}
		if status, body := get("/c/x"); status != http.StatusOK || body != "/c/x" {
			t.Errorf("%s: GET /c/x after the refused reload: %d %q, want the routes before it (200)", name, status, body)
		}
	}
}

// TestServeReloadOnHangup: a replica of pace serve, as a process of its
// own on a real Redis, serves 8 clients at 100/s burst 5; a SIGHUP with
// the limit halved in its file: from 1 s after, the upstream sees at most
// the new b + r*t (55) in any second, and at least 90% of its rate; no
// request fails. Then a SIGHUP with a file that does not read: the
// replica serves on at the halved limit. With 200 clients, whose waits
// are booked 2 s ahead at the old limit when the SIGHUP comes, the same
// holds: the reload announces the new limit, and the bookings made at the
// old one book anew at it (before, they went at the old pace for 2 s).
func TestServeReloadOnHangup(t *testing.T) {
	for _, clients := range []int{8, 200} {
		t.Run(fmt.Sprint(clients, " clients"), func(t *testing.T) { checkReloadOnHangup(t, clients) })
	}
}

// checkReloadOnHangup is TestServeReloadOnHangup's check, with clients
// clients.
func checkReloadOnHangup(t *testing.T, clients int) {
	redisServer := redistest.Start(t)
	var mu sync.Mutex
	var arrivals []time.Time
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
	}))
	defer upstream.Close()
	config := func(limit string) string {
		return fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: api, upstream: '%s', limit: '%s'}\n", redisServer.Addr, upstream.URL, limit)
	}
	r := startReplica(t, config("100/s burst 5"))
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(r.URL + "/x")
				if err != nil || resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	time.Sleep(2 * time.Second) // the clients' start, then a second at 100/s
	halved := r.reload(t, config("50/s burst 5"), "pace serve: reloaded")
	time.Sleep(2500 * time.Millisecond)
	broken := r.reload(t, "routes: [{name: api, limit: fast}]\n", "the configuration before it serves on")
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	busiest, fewest := 0, len(arrivals)
	for from := halved.Add(time.Second); !from.Add(time.Second).After(arrivals[len(arrivals)-1]); from = from.Add(50 * time.Millisecond) {
		n := countWithin(arrivals, from, from.Add(time.Second))
		busiest, fewest = max(busiest, n), min(fewest, n)
	}
	before := countWithin(arrivals, halved.Add(-time.Second), halved)
	afterBroken := countWithin(arrivals, broken.Add(500*time.Millisecond), broken.Add(1500*time.Millisecond))
	t.Logf("%d clients: before the reload, %d in its last second; from 1 s after it, %d to %d in any second; after the broken file, %d in a second; %d requests failed", clients, before, fewest, busiest, afterBroken, failed.Load())
	if busiest > 55 || fewest < 45 {
		t.Errorf("from 1 s after the reload, %d to %d in a second: want at most the new b + r*t (55), and at least 90%% of its rate", fewest, busiest)
	}
	if before < 90 {
		t.Errorf("before the reload, %d in a second: want about 100", before)
	}
	if failed.Load() != 0 {
		t.Errorf("%d requests failed, want none", failed.Load())
	}
}

// countWithin counts the times (sorted) from from, up to before to.
func countWithin(times []time.Time, from, to time.Time) int {
	i, _ := slices.BinarySearchFunc(times, from, time.Time.Compare)
	j, _ := slices.BinarySearchFunc(times, to, time.Time.Compare)
	return j - i
}

// rewrite writes config in the replica's file (after its listen line) and
// tells it to reload with a SIGHUP.
func (r *replica) rewrite(t *testing.T, config string) {
	t.Helper()
	if err := os.WriteFile(r.config, []byte("listen: 127.0.0.1:0\n"+config), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// reload rewrites the replica's config, and returns when it logged a line
// that holds outcome: the time the reload took effect, which a loaded
// machine may delay past the SIGHUP.
func (r *replica) reload(t *testing.T, config, outcome string) time.Time {
	t.Helper()
	for len(r.logs) > 0 {
		<-r.logs
	}
	r.rewrite(t, config)
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line := <-r.logs:
			if strings.Contains(line, outcome) {
				return time.Now()
			}
		case <-timeout:
			t.Fatalf("the replica logged no %q within 10 s of a SIGHUP", outcome)
		}
	}
}

// builtRoutes returns the routes the server has open.
func (s *server) builtRoutes() []*route {
	s.builtMu.Lock()
	defer s.builtMu.Unlock()
	return slices.Clone(s.built)
}

// TestServeReloadWhileRedisFrozen: pace serve as a process of its own, with
// three clients a route sending one request after another (X-Pace-Max-Wait
// 2.5 s). Redis is frozen (SIGSTOP), then a reload lowers route b to 50/s
// and adds route c. From 2.5 s after the reload to 5 s after, every route
// answers (no 429), each at its rate (b 40/s or more, but 55/s at most;
// a and c 80/s or more), on its outage share: a new route's limiter, which
// Redis never answered, is away at its first call's expiry (before, each of
// its requests waited past its budget, 429, as long as Redis stayed frozen).
// Then SIGTERM, with drain: 1s, ends the process within 1.5 s though Redis
// does not answer (before, 4.7 s).
func TestServeReloadWhileRedisFrozen(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	srv := redistest.Start(t)
	route := func(name, limit string) string {
		return fmt.Sprintf("  - {name: %s, path: /%s/, upstream: '%s', limit: %s}\n", name, name, upstream.URL, limit)
	}
	head := fmt.Sprintf("redis: redis://%s\ndrain: 1s\nroutes:\n", srv.Addr)
	r := startReplica(t, head+route("a", "100/s")+route("b", "100/s"))
	type answer struct {
		at     time.Time
		route  string
		status int
	}
	var mu sync.Mutex
	var answers []answer
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		for range 3 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest(http.MethodGet, r.URL+"/"+name+"/", nil)
					req.Header.Set(maxWaitHeader, "2.5s")
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					mu.Lock()
					answers = append(answers, answer{time.Now(), name, resp.StatusCode})
					mu.Unlock()
				}
			})
		}
	}
	time.Sleep(500 * time.Millisecond)
	srv.Freeze()
	defer srv.Thaw()
	time.Sleep(500 * time.Millisecond)
	reloaded := time.Now()
	r.rewrite(t, head+route("a", "100/s")+route("b", "50/s")+route("c", "100/s"))
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	from, to := reloaded.Add(2500*time.Millisecond), reloaded.Add(5*time.Second)
	served, refused := map[string]int{}, map[string]int{}
	for _, a := range answers {
		if a.at.Before(from) || a.at.After(to) {
			continue
		}
		if a.status == http.StatusOK {
			served[a.route]++
		} else {
			refused[a.route]++
		}
	}
	span := to.Sub(from).Seconds()
	t.Logf("from 2.5 s to 5 s after the reload: served %v, refused %v", served, refused)
	for name, least := range map[string]float64{"a": 80, "b": 40, "c": 80} {
		if rate := float64(served[name]) / span; rate < least || refused[name] > 0 || name == "b" && rate > 55 {
			t.Errorf("route %s: %.0f/s served, %d refused; want %.0f/s at least (b 55/s at most), none refused", name, rate, refused[name], least)
		}
	}
	began := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.cmd.Wait()
	if took := time.Since(began); took > 1500*time.Millisecond {
		t.Errorf("SIGTERM with drain: 1s and Redis frozen took %v, want 1.5 s at most", took)
	}
}
