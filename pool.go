package pace

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/store"
)

// A Pool is the credentials of one upstream (API keys, deployments), each
// with a quota of its own: a Transport with a Pool sends each request with
// the credential that can go soonest, chosen for the whole fleet in the
// same call that books its wait (on Local, among its buckets as they
// stand). A credential the upstream holds (a 429 with Retry-After), slows
// or spends is passed over for the others until it can go again; one it
// rejects (a 401 or 403 that asks for no hold), for a second, then twice
// as long each time again, until a success proves it good.
//
// Each credential is a key of its own on the Transport's limiter: the
// request's key in braces, then the credential's name ("{api.openai.com:443}A"),
// so that a pool's keys share one Redis Cluster slot. Its holds, counters,
// refusals and events are its own; its secret never leaves the process:
// Redis, events and errors know the name alone.
//
// Use a Pool by pointer; it must not change once in use. A Pool under a
// quota with a cap in flight (Concurrent) is refused.
type Pool struct {
	// Credentials are the pool's, at least one, each named once.
	Credentials []Credential

	// Header is the request header that carries the chosen credential's
	// secret, replacing what the caller put there: "Bearer " and the
	// secret in Authorization (the default), the secret alone in any
	// other. Apply, if set, is used instead.
	Header string

	// Apply, if set, puts c on req, a clone of the caller's request made
	// for it.
	Apply func(req *http.Request, c Credential)

	// Affinity, if set, names a request header (such as a session or
	// conversation id) whose value keeps requests on one credential while
	// that credential can go at once: an upstream's prompt cache, kept per
	// credential, stays warm. Requests without the header, or with no
	// Affinity, start from the next credential in turn.
	Affinity string

	turn     atomic.Uint32 // the credential asked first by the next request without affinity
	checking sync.Once
	mistake  error // what check found, once
}

// Wait waits, as l's Wait does, for cost on the key of whichever of the
// pool's credentials under key can go soonest, and returns that
// credential: for work that does not pass through a Transport. l must be
// Local or Redis.
func (p *Pool) Wait(ctx context.Context, l Limiter, key string, cost int) (Credential, error) {
	if err := p.checked(); err != nil {
		return Credential{}, err
	}
	backend, ok := backendOf(l)
	if !ok || isNil(l) {
		return Credential{}, fmt.Errorf("pace: Pool.Wait: key %s: a Pool needs a limiter that chooses, Local or Redis, not a %s", store.QuoteKey(key), limiterType(l))
	}
	at := p.target(key, nil)
	_, g, err := backend.admit(ctx, at, cost)
	if err != nil {
		return Credential{}, err
	}
	return p.credential(at, g.booking.key), nil
}

// A Credential is one of a Pool's: its Name keys its quota and names it
// in events; its Secret is what the request carries.
type Credential struct {
	Name   string // letters, digits, '-', '_' and '.'
	Secret string
}

// String returns the credential's name, never its secret.
func (c Credential) String() string { return c.Name }

// GoString returns the credential's name, never its secret.
func (c Credential) GoString() string { return fmt.Sprintf("pace.Credential{Name: %q}", c.Name) }

// MarshalText returns the credential's name, never its secret: what
// encoders that heed it (JSON, XML, YAML, slog's handlers) write.
func (c Credential) MarshalText() ([]byte, error) { return []byte(c.Name), nil }

// MarshalBinary returns the credential's name, never its secret: what gob
// writes.
func (c Credential) MarshalBinary() ([]byte, error) { return []byte(c.Name), nil }

// checked reports what makes p unusable (see Check), checked once.
func (p *Pool) checked() error {
	p.checking.Do(func() { p.mistake = p.Check() })
	return p.mistake
}

// Check reports what makes p unusable, naming the credential at fault (and
// never its secret): no credentials, a name used twice or that is not
// letters, digits, '-', '_' and '.', a secret held by an earlier credential
// too (its quota would be spent twice as fast as either key's counts); and,
// unless Apply puts the secrets, an empty secret, or one that cannot be a
// header value (a control character, or spaces around it, which the
// upstream would trim). A Transport finds the same at its first request,
// and fails each.
func (p *Pool) Check() error {
	if len(p.Credentials) == 0 {
		return errors.New("pace: Pool has no Credentials")
	}
	names := make(map[string]bool, len(p.Credentials))
	secrets := make(map[string]string, len(p.Credentials))
	for i, c := range p.Credentials {
		switch {
		case !credentialName(c.Name):
			return fmt.Errorf("pace: Pool.Credentials[%d]: name %q: want letters, digits, '-', '_' or '.', one at least", i, c.Name)
		case names[c.Name]:
			return fmt.Errorf("pace: Pool.Credentials[%d]: name %q is taken by an earlier credential", i, c.Name)
		case c.Secret != "" && secrets[c.Secret] != "":
			return fmt.Errorf("pace: Pool.Credentials[%d] %q: its secret is %q's too: one key's quota would be counted as two; give each credential its own secret", i, c.Name, secrets[c.Secret])
		case p.Apply != nil:
		case c.Secret == "":
			return fmt.Errorf("pace: Pool.Credentials[%d] %q: empty secret", i, c.Name)
		case !headerValue(c.Secret):
			return fmt.Errorf("pace: Pool.Credentials[%d] %q: its secret cannot be a header value (a control character such as a newline, or spaces around it): check how it was read", i, c.Name)
		}
		names[c.Name], secrets[c.Secret] = true, c.Name
	}
	return nil
}

// headerValue reports whether v can be sent as a header value as it is:
// no control character but a tab, no space or tab around it.
func headerValue(v string) bool {
	for _, c := range []byte(v) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return strings.TrimSpace(v) == v
}

// credentialName reports whether name may name a credential: it ends a
// key, after the braces, and may hold nothing pace's own keys add there.
func credentialName(name string) bool {
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return name != ""
}

// rejected is the hold of a Pool's credential whose request the upstream
// answered status, when the answer asks for no hold of its own: none,
// unless it rejects the credential (401 or 403: a key revoked, expired or
// out of credit). A pool of more than one credential then passes over it
// for a second, and twice as long each time it is rejected again
// (Hold.Repeats), up to the limiter's MaxHold, until a success proves it
// good; a pool of one sends the upstream's answers through as they come.
func rejected(status int) []headers.Hold {
	if status != http.StatusUnauthorized && status != http.StatusForbidden {
		return nil
	}
	return []headers.Hold{{For: time.Second, Reason: strconv.Itoa(status) + " rejects the credential", Repeats: true}}
}

// target returns the target of req, whose key is key: each credential's
// key, asked from the one of req's affinity, or the next in turn.
func (p *Pool) target(key string, req *http.Request) target {
	at := target{pool: make([]string, len(p.Credentials))}
	for i, c := range p.Credentials {
		at.pool[i] = "{" + key + "}" + c.Name
	}
	if value := p.affinity(req); value != "" {
		h := fnv.New32a()
		h.Write([]byte(value))
		at.first = int(h.Sum32() % uint32(len(at.pool)))
	} else {
		at.first = int(p.turn.Add(1) % uint32(len(at.pool)))
	}
	at.key = at.pool[at.first]
	return at
}

// affinity is req's value of the Affinity header, "" for none (or no
// req).
func (p *Pool) affinity(req *http.Request) string {
	if p.Affinity == "" || req == nil {
		return ""
	}
	return req.Header.Get(p.Affinity)
}

// credential returns the credential of key, one of at's keys.
func (p *Pool) credential(at target, key string) Credential {
	for i, k := range at.pool {
		if k == key {
			return p.Credentials[i]
		}
	}
	return p.Credentials[at.first]
}

// apply returns a clone of req that carries c.
func (p *Pool) apply(req *http.Request, c Credential) *http.Request {
	req = req.Clone(req.Context())
	switch header := http.CanonicalHeaderKey(p.Header); {
	case p.Apply != nil:
		p.Apply(req, c)
	case header == "" || header == "Authorization":
		req.Header.Set("Authorization", "Bearer "+c.Secret)
	default:
		req.Header.Set(header, c.Secret)
	}
	return req
}

// errPoolCapped refuses the wait of a pool on a quota with a cap in flight.
func errPoolCapped(at target) error {
	return &requestError{fmt.Sprintf("pace: key %s: a Pool's keys cannot share a quota with a cap in flight (Concurrent)", store.QuoteKey(at.key))}
}
