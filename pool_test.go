package pace

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fleetpace/pace/internal/store"
	"github.com/fleetpace/pace/usage"
	"github.com/redis/go-redis/v9"
)

// poolSecret is the secret of the test credential named name.
func poolSecret(name string) string { return "sk-test-" + name + "-0123456789" }

// testPool is a Pool of the credentials named, with their poolSecret.
func testPool(names ...string) *Pool {
	p := &Pool{}
	for _, name := range names {
		p.Credentials = append(p.Credentials, Credential{Name: name, Secret: poolSecret(name)})
	}
	return p
}

// credentialOf returns the name of the test credential whose secret req
// carries in Authorization, or "".
func credentialOf(req *http.Request) string {
	name, _ := strings.CutSuffix(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer sk-test-"), "-0123456789")
	return name
}

// TestPoolMistakes: a Pool that cannot work is an error that names what
// is wrong, at the first request, which reaches no upstream.
func TestPoolMistakes(t *testing.T) {
	loc := mustLocal(t, Every(time.Millisecond))
	capped := mustLocal(t, AllOf(Every(time.Millisecond), Concurrent(2)))
	for _, c := range []struct {
		name    string
		pool    *Pool
		limiter Limiter
		want    string
	}{
		{"empty", &Pool{}, loc, "Pool has no Credentials"},
		{"unnamed", &Pool{Credentials: []Credential{{Secret: "s"}}}, loc, `Credentials[0]: name ""`},
		{"a brace", &Pool{Credentials: []Credential{{Name: "a}b", Secret: "s"}}}, loc, `name "a}b"`},
		{"a colon", &Pool{Credentials: []Credential{{Name: "a:tokens", Secret: "s"}}}, loc, `name "a:tokens"`},
		{"twice", testPool("A", "B", "A"), loc, `Credentials[2]: name "A" is taken`},
		{"no secret", &Pool{Credentials: []Credential{{Name: "A"}}}, loc, `Credentials[0] "A": empty secret`},
		{"one secret twice", &Pool{Credentials: []Credential{{Name: "A", Secret: "sk-1"}, {Name: "B", Secret: "sk-2"}, {Name: "C", Secret: "sk-1"}}}, loc, `Credentials[2] "C": its secret is "A"'s too`},
		{"a newline", &Pool{Credentials: []Credential{{Name: "A", Secret: "sk-1\n"}}}, loc, `Credentials[0] "A": its secret cannot be a header value`},
		{"a space around", &Pool{Credentials: []Credential{{Name: "A", Secret: " sk-1"}}}, loc, `Credentials[0] "A": its secret cannot be a header value`},
		{"a NUL", &Pool{Credentials: []Credential{{Name: "A", Secret: "sk\x001"}}}, loc, `Credentials[0] "A": its secret cannot be a header value`},
		{"capped", testPool("A", "B"), capped, "cannot share a quota with a cap in flight"},
		{"no limiter", testPool("A"), nil, "Pool without a Limiter"},
		{"a user's limiter", testPool("A"), LimiterFunc(func(context.Context, string, int) error { return nil }), "needs a limiter that chooses, Local or Redis"},
	} {
		t.Run(c.name, func(t *testing.T) {
			reached := false
			tr := &Transport{Limiter: c.limiter, Pool: c.pool, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				reached = true
				return nil, errors.New("reached")
			})}
			_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://api.example.com/", nil))
			if err == nil || !strings.Contains(err.Error(), c.want) || reached {
				t.Errorf("err %v (the upstream reached: %v), want one that says %q", err, reached, c.want)
			}
		})
	}
}

// LimiterFunc is a Limiter of a user's, for tests.
type LimiterFunc func(ctx context.Context, key string, cost int) error

// Wait calls f.
func (f LimiterFunc) Wait(ctx context.Context, key string, cost int) error { return f(ctx, key, cost) }

// TestPoolChoosesTheSoonest, on Local and Redis: three credentials at
// 2/s burst 1 each. Three requests at once go at once, one on each; B's
// answer holds B for 5 s; the next three go on A and C alone, at their
// refills, none on B. The credential's secret is in the request the
// upstream sees, and not in the caller's.
func TestPoolChoosesTheSoonest(t *testing.T) {
	for name, l := range bothLimiters(t, "2/s burst 1") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checkPoolChooses(t, l)
		})
	}
}

// bothLimiters returns a Local and a Redis limiter (see scriptRedis) of
// limit, by name.
func bothLimiters(t *testing.T, limit string) map[string]Limiter {
	return map[string]Limiter{
		"local": mustLocal(t, mustParseLimit(t, limit)),
		"redis": mustRedis(t, scriptRedis(t), mustParseLimit(t, limit), WithFleetSize(1), sharedOnly),
	}
}

// TestPoolPassesOverARejectedCredential, on Local and Redis: of three
// credentials at 1000/s, B's is rejected (401, or 403, with no hold asked).
// 60 requests one after another over about 1.5 s: B gets its first, and
// one after its first second (1 s, then 2 s: rejected again, it doubles),
// 3 at most, where a turn each would give it 20; the rest go on A and C,
// all served. Then B is good again: once its hold ends, a success on it
// proves it, and it takes its turns (8 within 6 s).
func TestPoolPassesOverARejectedCredential(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		for name, l := range bothLimiters(t, "1000/s") {
			t.Run(fmt.Sprintf("%d %s", status, name), func(t *testing.T) {
				t.Parallel()
				var mu sync.Mutex
				counts := map[string]int{}
				bad := true
				upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					defer mu.Unlock()
					c := credentialOf(r)
					counts[c]++
					if c == "B" && bad {
						w.WriteHeader(status)
					}
				}))
				defer upstream.Close()
				client := &http.Client{Transport: &Transport{Limiter: l, Pool: testPool("A", "B", "C")}}
				get := func() int {
					resp, err := client.Get(upstream.URL)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					return resp.StatusCode
				}
				rejected := 0
				for range 60 {
					if get() != http.StatusOK {
						rejected++
					}
					time.Sleep(25 * time.Millisecond)
				}
				mu.Lock()
				t.Logf("60 requests: %v, %d rejected", counts, rejected)
				if counts["B"] > 3 || counts["B"] < 1 || counts["A"]+counts["C"] < 57 {
					t.Errorf("60 requests with B rejected: %v; want B's 1 to 3, the rest on A and C", counts)
				}
				bad, before := false, counts["B"]
				mu.Unlock()
				onB := func() int {
					mu.Lock()
					defer mu.Unlock()
					return counts["B"] - before
				}
				// B's hold ends within 2 s (its second); then its first
				// success proves it, and it takes its turns.
				for deadline := time.Now().Add(6 * time.Second); onB() < 8 && time.Now().Before(deadline); {
					get()
					time.Sleep(25 * time.Millisecond)
				}
				if got := onB(); got < 8 {
					t.Errorf("6 s after B is good again: %d requests on B, want 8 at least", got)
				}
			})
		}
	}
}

// checkPoolChooses is TestPoolChoosesTheSoonest's check, on l.
func checkPoolChooses(t *testing.T, l Limiter) {
	var mu sync.Mutex
	var sent []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		name := credentialOf(r)
		sent = append(sent, name)
		if name == "B" && !strings.Contains(strings.Join(sent[:len(sent)-1], ","), "B") {
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer upstream.Close()
	client := &http.Client{Transport: &Transport{Limiter: l, Pool: testPool("A", "B", "C")}}
	get := func(within time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
		req.Header.Set("Authorization", "Bearer the caller's")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := req.Header.Get("Authorization"); got != "Bearer the caller's" {
			t.Errorf("the caller's request was changed: Authorization %q", got)
		}
	}
	start := time.Now()
	for range 3 {
		get(200 * time.Millisecond) // at once, or refused
	}
	first := time.Since(start)
	for range 3 {
		get(5 * time.Second)
	}
	took := time.Since(start)
	t.Logf("sent on %v; the first three in %v, all six in %v", sent, first, took)
	if fmt.Sprint(slices.Sorted(slices.Values(sent[:3]))) != "[A B C]" {
		t.Errorf("the first three requests went on %v, want one on each of A, B and C", sent[:3])
	}
	for _, name := range sent[3:] {
		if name != "A" && name != "C" {
			t.Errorf("after B's hold, a request went on %q, want A or C (B is held for 5 s)", name)
		}
	}
	if took > 2*time.Second {
		t.Errorf("six requests took %v, want about 1 s: the third after the hold waits for A's or C's second refill, not B's hold", took)
	}
}

// TestPoolBooksOnceAskedAgain: a pool's booking whose answer was lost,
// asked again under its call, finds the key it booked, and books nothing
// twice.
func TestPoolBooksOnceAskedAgain(t *testing.T) { checkPoolBooksOnce(t, scriptRedis(t)) }

// checkPoolBooksOnce is TestPoolBooksOnceAskedAgain's check, on c.
func checkPoolBooksOnce(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	r := mustRedis(t, c, mustParseLimit(t, "1/s burst 1"), WithFleetSize(1), sharedOnly)
	pool := []string{"{api}A", "{api}B"}
	book := func(call uint64) store.Booking {
		t.Helper()
		b, err := r.store.Reserve(ctx, store.Request{Pool: pool, Costs: uniform(1, 1), Call: call}, time.Minute, 0)
		if err != nil || !b.Granted {
			t.Fatalf("booking %+v: %v", b, err)
		}
		return b
	}
	a, b := book(0), book(0)
	if a.Pick == b.Pick || a.Delay > 0 || b.Delay > 0 {
		t.Fatalf("two bookings at once went on %d and %d after %v and %v, want one on each at once", a.Pick, b.Pick, a.Delay, b.Delay)
	}
	call := r.store.NewCall()
	late := book(call)
	again := book(call)
	if again.Pick != late.Pick || again.Due() != late.Due() || again.ID != late.ID {
		t.Errorf("asked again: %s due %d, want %s due %d, as first booked", pool[again.Pick], again.Due(), pool[late.Pick], late.Due())
	}
	next, last := book(0), book(0)
	t.Logf("booked on %s, %s, %s (asked again: %s), then %s and %s, due %v and %v after the third",
		pool[a.Pick], pool[b.Pick], pool[late.Pick], pool[again.Pick], pool[next.Pick], pool[last.Pick],
		time.Duration(next.Due()-late.Due())*time.Microsecond, time.Duration(last.Due()-late.Due())*time.Microsecond)
	if next.Pick == late.Pick || next.Due()-late.Due() > 100_000 {
		t.Errorf("the next booking went on %s, %d us after the third, want the other key at about the same time", pool[next.Pick], next.Due()-late.Due())
	}
	if gap := last.Due() - late.Due(); gap > 1_100_000 {
		t.Errorf("the booking after went %d us after the third on its key, want a second: the third was booked twice", gap)
	}
}

// TestPoolMistakesNameNoSecret: Check's errors name the credential, never
// its secret; a Pool whose Apply puts the secrets may hold secrets that
// are no header values, or none.
func TestPoolMistakesNameNoSecret(t *testing.T) {
	err := (&Pool{Credentials: []Credential{{Name: "A", Secret: "sk-secret-1"}, {Name: "B", Secret: "sk-secret-1"}}}).Check()
	if err == nil || strings.Contains(err.Error(), "sk-secret") {
		t.Errorf("a secret twice: %v, want an error without the secret", err)
	}
	apply := func(req *http.Request, c Credential) { req.Header.Set("X-Key", c.Name) }
	if err := (&Pool{Credentials: []Credential{{Name: "A", Secret: "line\n"}, {Name: "B"}, {Name: "C"}}, Apply: apply}).Check(); err != nil {
		t.Errorf("secrets that Apply puts: %v, want none", err)
	}
}

// TestCredentialEncodesNoSecret: every encoder a program may hand a
// Credential or a Pool to (fmt's verbs, JSON, XML, gob, slog's JSON and
// text handlers) writes the credential's name, never its secret.
func TestCredentialEncodesNoSecret(t *testing.T) {
	const secret = "sk-live-0123456789"
	c := Credential{Name: "A", Secret: secret}
	pool := &Pool{Credentials: []Credential{c}}
	var out []string
	out = append(out, fmt.Sprintf("%v %+v %#v %s %q", c, c, c, c, c), fmt.Sprintf("%v %+v", pool, pool))
	type doc struct{ Credentials []Credential }
	x, err := xml.Marshal(doc{[]Credential{c}})
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, string(x))
	// A Pool's Apply, a func, is no value JSON or gob encode: they refuse
	// a Pool, and write nothing; a Credential they encode.
	for _, v := range []any{c, []Credential{c}, map[string]Credential{"k": c}, pool} {
		_, isPool := v.(*Pool)
		j, jerr := json.Marshal(v)
		var g bytes.Buffer
		gerr := gob.NewEncoder(&g).Encode(v)
		if err := errors.Join(jerr, gerr); err != nil && !isPool {
			t.Errorf("encoding %T: %v", v, err)
		}
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("pool", "credential", v)
		slog.New(slog.NewTextHandler(&logs, nil)).Info("pool", "credential", v)
		out = append(out, string(j)+g.String()+logs.String())
	}
	for _, text := range out {
		if strings.Contains(text, secret) || !strings.Contains(text, "A") {
			t.Errorf("an encoding of a credential: %q; want its name, never its secret", text)
		}
	}
}

// TestPoolKeepsSecretsOut: after requests, holds, refusals and a settled
// reservation through a Pool on Redis, no secret is in Redis (keys or
// values), an event or an error, and a Credential prints as its name.
func TestPoolKeepsSecretsOut(t *testing.T) {
	c := scriptRedis(t)
	var log eventLog
	l := mustRedis(t, c, AllOf(mustParseLimit(t, "100/s burst 2").Named("requests"), mustParseLimit(t, "1000/s burst 100").Named("tokens")), WithFleetSize(1), sharedOnly, WithObserver(log.observe))
	answers := []int{http.StatusOK, http.StatusTooManyRequests, http.StatusServiceUnavailable}
	var n int
	var mu sync.Mutex
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		status := answers[n%len(answers)]
		mu.Unlock()
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(status)
		io.WriteString(w, `{"usage": {"total_tokens": 7}}`)
	}))
	defer upstream.Close()
	pool := testPool("A", "B", "C")
	tr := &Transport{Limiter: l, Pool: pool, Estimate: func(*http.Request) Costs { return Costs{"requests": 1, "tokens": 10} },
		Settle: func(*http.Response, usage.Ends) (Costs, bool) { return Costs{"requests": 1, "tokens": 7}, true }}
	var errs []string
	for range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			errs = append(errs, err.Error())
		} else {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		cancel()
	}
	var seen []string
	keys, err := c.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		seen = append(seen, key, c.Dump(context.Background(), key).Val())
	}
	log.mu.Lock()
	events := len(log.events)
	for _, e := range log.events {
		seen = append(seen, fmt.Sprintf("%v %+v", e, e))
	}
	log.mu.Unlock()
	seen = append(seen, errs...)
	seen = append(seen, fmt.Sprintf("%v %+v %#v %s", pool.Credentials[0], pool.Credentials, pool.Credentials[1], pool.Credentials[2]))
	t.Logf("%d Redis keys, %d events, %d errors read", len(keys), events, len(errs))
	for _, text := range seen {
		for _, c := range pool.Credentials {
			if strings.Contains(text, c.Secret) || strings.Contains(text, "0123456789") {
				t.Errorf("credential %s's secret in %q", c.Name, text)
			}
		}
	}
	if all := strings.Join(keys, " "); !strings.Contains(all, "}A") || !strings.Contains(all, "}B") {
		t.Errorf("Redis keys %v: want the pool's keys, {key}NAME", keys)
	}
}

// TestPoolAffinity, on Local and Redis: six sessions send 20 requests a
// second each for 2 s through a Pool of three credentials at 100/s burst
// 5 each, which has room for them all. With Affinity on the session's
// header, at least 95% of each session's requests go on one credential.
// (Without, logged beside: each request starts from the next credential in
// turn, and a session keeps to none.)
func TestPoolAffinity(t *testing.T) {
	for name, l := range bothLimiters(t, "100/s burst 5") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, affinity := range []string{"X-Session", ""} {
				shares := sessionShares(t, l, affinity)
				t.Logf("affinity %q: the share of each session's requests on its most used credential: %.2f", affinity, shares)
				for i, share := range shares {
					if affinity != "" && share < 0.95 {
						t.Errorf("affinity %q: session %d sent %.0f%% of its requests on its most used credential, want 95%% at least", affinity, i, 100*share)
					}
				}
			}
		})
	}
}

// sessionShares runs six sessions of 20 requests a second for 2 s through a
// Pool of three credentials on l, with Affinity set to affinity (each
// request carries its session in X-Session), and returns, for each
// session, the share of its requests that went on the credential it used
// most.
func sessionShares(t *testing.T, l Limiter, affinity string) []float64 {
	var mu sync.Mutex
	sent := map[string]map[string]int{} // by session, by credential
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		session := r.Header.Get("X-Session")
		if sent[session] == nil {
			sent[session] = map[string]int{}
		}
		sent[session][credentialOf(r)]++
	}))
	defer upstream.Close()
	pool := testPool("A", "B", "C")
	pool.Affinity = affinity
	client := &http.Client{Transport: &Transport{Limiter: l, Pool: pool, Key: func(*http.Request) string { return "affinity " + affinity }}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for range 40 {
				<-tick.C
				req, _ := http.NewRequest(http.MethodGet, upstream.URL, nil)
				req.Header.Set("X-Session", fmt.Sprintf("conversation-%d", i))
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	var shares []float64
	for _, bySession := range sent {
		most, all := 0, 0
		for _, n := range bySession {
			most, all = max(most, n), all+n
		}
		shares = append(shares, float64(most)/float64(all))
	}
	if len(shares) != 6 {
		t.Errorf("%d sessions reached the upstream, want 6", len(shares))
	}
	return shares
}

// TestPoolWait: Pool.Wait, for work that does not pass through a
// Transport, returns the credential that could go soonest: two waits at
// once get one credential each, a third waits for a refill or is refused
// within a shorter deadline, which names the wait; a Limiter of a user's
// is refused.
func TestPoolWait(t *testing.T) {
	ctx := context.Background()
	pool := testPool("A", "B")
	l := mustLocal(t, mustParseLimit(t, "1/s burst 1"))
	a, errA := pool.Wait(ctx, l, "crawl", 1)
	b, errB := pool.Wait(ctx, l, "crawl", 1)
	if errA != nil || errB != nil || a.Name == b.Name {
		t.Fatalf("two waits: %v (%v) and %v (%v), want one on each credential", a, errA, b, errB)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	var late *DeadlineError
	if c, err := pool.Wait(short, l, "crawl", 1); !errors.As(err, &late) || !strings.Contains(err.Error(), "{crawl}") {
		t.Errorf("a third wait within 100 ms: %v, %v; want a *DeadlineError that names the key", c, err)
	}
	if _, err := pool.Wait(ctx, LimiterFunc(func(context.Context, string, int) error { return nil }), "crawl", 1); err == nil {
		t.Error("Pool.Wait on a Limiter of a user's: no error")
	}
}

// TestPoolForeignDataNamesItsKey: foreign data at the second credential's
// bucket, asked first, is a *KeyError for that credential's key and Redis
// key (before, it named the pool's first key).
func TestPoolForeignDataNamesItsKey(t *testing.T) {
	c := newTestRedis(t) // the embedded store's Lua hands pick.lua's pcall the error otherwise
	r := mustRedis(t, c, mustParseLimit(t, "1/s burst 1"), WithFleetSize(1), sharedOnly)
	if err := c.Set(context.Background(), DefaultPrefix+"{{api}B}", "lots", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := r.store.Reserve(context.Background(), store.Request{Pool: []string{"{api}A", "{api}B"}, First: 1, Costs: uniform(1, 1)}, time.Minute, 0)
	var keyErr *KeyError
	if !errors.As(err, &keyErr) || keyErr.Key != "{api}B" || keyErr.RedisKey != DefaultPrefix+"{{api}B}" {
		t.Errorf("foreign data at B's bucket: %v (%+v), want a *KeyError naming {api}B and its Redis key", err, keyErr)
	}
}

// TestPoolProbeDropsARecoveredRate: a pool's probe that finds a key's rate
// back at its configured one drops it, and the booking on that key says
// so (Recovered), though the booking after the probe, its rate gone, is a
// plain one, whose reply leaves that off on a quota of one bucket (see
// lua/record.lua's booking_reply, and pick.lua); and on a quota of two
// limits, whose reply is whole. Redis's clock is miniredis's, set.
func TestPoolProbeDropsARecoveredRate(t *testing.T) {
	for name, q := range map[string]Quota{"one bucket": PerSecond(1000), "two limits": AllOf(PerSecond(1000), PerHour(1e6))} {
		t.Run(name, func(t *testing.T) {
			m := miniredis.RunT(t)
			start := time.Unix(1_800_000_000, 0)
			m.SetTime(start)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			s := storeOf(mustRedis(t, c, q, WithFleetSize(1), sharedOnly))
			ctx := context.Background()
			one := uniform(1, store.MaxLimits)
			b, err := s.Reserve(ctx, store.Request{Key: "a", Costs: one, Settled: true}, MaxDelay, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Refused(ctx, "a", b, false, 0, "pace-test-holds"); err != nil {
				t.Fatal(err)
			}
			m.SetTime(start.Add(time.Minute)) // quiet since, and past steer.Period
			p, err := s.Reserve(ctx, store.Request{Key: "a", Pool: []string{"a", "b"}, Costs: one, Settled: true}, MaxDelay, 0)
			if err != nil || !p.Granted || !p.Recovered || p.Pick != 0 || p.Listening {
				t.Fatalf("a pool's booking on a key whose rate recovered: %+v, %v; want granted on a, its rate recovered, not listening", p, err)
			}
		})
	}
}
