package pace

import (
	crand "crypto/rand"
	"encoding/hex"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
)

// A Process is what the Redis limiters of one process share: its name
// among the fleet's members (a fleet counts processes, not limiters), the
// numbering of its limiters, and the local limiters that pace its share of
// each quota while Redis is away (one per quota, however many limiters
// book it).
//
// A program has one Process, the default of every Redis limiter. Tests and
// simulations that run several processes of a fleet in one Go program give
// each its own with WithProcess. A Process is safe for concurrent use;
// make one with NewProcess or NewNamedProcess (a limiter refuses the zero
// value, which has no name).
type Process struct {
	member     string
	limiterIDs atomic.Uint64
	fallbacks  fallbacks

	mu     sync.Mutex
	jitter *rand.Rand // spreads the cool-downs of the process's limiters
}

// NewProcess returns a Process named by the host, the process id and a
// random suffix, as the default is.
func NewProcess() *Process {
	var id [6]byte
	crand.Read(id[:])
	host, _ := os.Hostname()
	return NewNamedProcess(host + ":" + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(id[:]))
}

// NewNamedProcess returns a Process that the fleet counts as name, whose
// random draws (the spread of its cool-downs) follow from the name: a
// simulation's processes, named alike from run to run, replay their runs.
// Two processes of one fleet must not share a name.
func NewNamedProcess(name string) *Process {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &Process{member: name, fallbacks: fallbacks{by: make(map[string]*fallback)},
		jitter: rand.New(rand.NewPCG(h.Sum64(), 0))}
}

// draw returns a random number in [0, 1) from p's source.
func (p *Process) draw() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.jitter.Float64()
}

// thisProcess is the process the program runs in: every limiter's, unless
// WithProcess says otherwise.
var thisProcess = sync.OnceValue(NewProcess)

// WithProcess makes the limiter one of p's: it counts in its fleet as p,
// and shares p's outage limiters. The default (also for a nil p) is the
// program's own process.
func WithProcess(p *Process) Option {
	return redisOption{"WithProcess", func(c *redisConfig) { c.process = p }}
}

// newLimiterID returns the id of a new Redis limiter of p, which (p's name
// and a number) keeps the names of its requests in Redis apart from other
// limiters': the grants of sliding windows, the holders of slots.
func (p *Process) newLimiterID() string {
	return p.member + ":" + strconv.FormatUint(p.limiterIDs.Add(1), 10)
}
