package pace

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"
)

// An Option configures a limiter. The options of a Redis limiter alone
// (WithPrefix, WithCallTimeout, WithFailurePolicy, WithFleetName,
// WithFleetSize, WithCooldown, WithProcess) make NewLocal fail, naming the
// option.
type Option interface {
	apply(*redisConfig)
}

// commonConfig is what both limiters can be told.
type commonConfig struct {
	observer Observer
	maxWait  time.Duration
	maxHold  time.Duration // the longest anything a response says may delay a key (validate makes 0 DefaultMaxHold)
	lease    time.Duration // a slot's lease (validate makes 0 DefaultLease)
	horizons map[Class]time.Duration
	dryRun   bool // see WithDryRun
}

func (c *commonConfig) validate() error {
	switch {
	case c.maxWait < 0:
		return fmt.Errorf("pace: WithMaxWait(%v): negative", c.maxWait)
	case c.maxHold != 0 && (c.maxHold < time.Millisecond || c.maxHold > MaxDelay):
		return fmt.Errorf("pace: WithMaxHold(%v): want from 1ms to MaxDelay, or 0 for the default", c.maxHold)
	case c.lease != 0 && (c.lease < minLease || c.lease > maxLease):
		return fmt.Errorf("pace: WithLease(%v): want from %v to %v", c.lease, minLease, maxLease)
	}
	c.maxHold, c.lease = cmp.Or(c.maxHold, DefaultMaxHold), cmp.Or(c.lease, DefaultLease)
	return checkHorizons(c.horizons)
}

// DefaultLease is how long a slot of a cap in flight (Concurrent) outlives
// its holder's last renewal; see WithLease.
const DefaultLease = 3 * time.Second

// The bounds of WithLease.
const (
	minLease = 30 * time.Millisecond
	maxLease = time.Hour
)

// redisConfig is what a Redis limiter can be told.
type redisConfig struct {
	commonConfig
	prefix                   string
	callTimeout              time.Duration
	policy                   FailurePolicy
	fleetName                string
	fleetSize                int
	minCooldown, maxCooldown time.Duration
	process                  *Process // WithProcess; validate makes nil thisProcess
	noTokenLeases            bool     // WithTokenLeases(false)
}

// The defaults of a Redis limiter.
const (
	// DefaultPrefix starts the name of every Redis key pace writes.
	DefaultPrefix = "pace:"
	// DefaultCallTimeout is the least timeout of a Redis call (see
	// WithCallTimeout).
	DefaultCallTimeout = 50 * time.Millisecond
	// DefaultMinCooldown and DefaultMaxCooldown bound the time a failing
	// Redis is left alone before the next probe.
	DefaultMinCooldown = 100 * time.Millisecond
	DefaultMaxCooldown = 2 * time.Second
)

func defaultRedisConfig() redisConfig {
	return redisConfig{
		prefix:      DefaultPrefix,
		callTimeout: DefaultCallTimeout,
		fleetName:   "default",
		minCooldown: DefaultMinCooldown,
		maxCooldown: DefaultMaxCooldown,
	}
}

func (c *redisConfig) validate() error {
	switch {
	case strings.ContainsAny(c.prefix, "{}"):
		return fmt.Errorf("pace: WithPrefix(%q): a prefix may not contain '{' or '}', which pace uses for the Redis Cluster hash tag", c.prefix)
	case c.fleetName == "" || strings.ContainsAny(c.fleetName, "{}"):
		return fmt.Errorf("pace: WithFleetName(%q): want a name without '{' or '}'", c.fleetName)
	case c.callTimeout <= 0:
		return fmt.Errorf("pace: WithCallTimeout(%v): not positive", c.callTimeout)
	case c.policy > FailClosed:
		return fmt.Errorf("pace: WithFailurePolicy(%v): unknown policy", c.policy)
	case c.fleetSize < 0:
		return fmt.Errorf("pace: WithFleetSize(%d): negative", c.fleetSize)
	case c.minCooldown <= 0 || c.maxCooldown < c.minCooldown:
		return fmt.Errorf("pace: WithCooldown(%v, %v): want 0 < min <= max", c.minCooldown, c.maxCooldown)
	case c.process != nil && (c.process.member == "" || c.process.jitter == nil):
		return errors.New(`pace: WithProcess: a Process without a name: make it with NewProcess, or NewNamedProcess("NAME")`)
	}
	if c.process == nil {
		c.process = thisProcess()
	}
	return c.commonConfig.validate()
}

// A commonOption is an option of both limiters.
type commonOption func(*commonConfig)

func (o commonOption) apply(c *redisConfig) { o(&c.commonConfig) }

// A redisOption is an option of a Redis limiter alone, named for NewLocal's
// error.
type redisOption struct {
	name string
	set  func(*redisConfig)
}

func (o redisOption) apply(c *redisConfig) { o.set(c) }

// localConfig is what opts tell a Local, or an error for an option of a
// Redis limiter alone.
func localConfig(opts []Option) (commonConfig, error) {
	var c redisConfig
	for _, o := range opts {
		if r, ok := o.(redisOption); ok {
			return commonConfig{}, fmt.Errorf("pace: NewLocal: %s is an option of a Redis limiter, and a Local has no Redis (drop it, or use NewRedis)", r.name)
		}
		o.apply(&c)
	}
	return c.commonConfig, nil
}

// WithObserver sets the Observer that sees every decision. The default is none.
func WithObserver(o Observer) Option {
	return commonOption(func(c *commonConfig) { c.observer = o })
}

// WithMaxWait caps every wait at d, as if each caller's context had a
// deadline d from now: a longer wait is refused at once with a
// *DeadlineError. Zero, the default, means no cap beyond the context's own.
func WithMaxWait(d time.Duration) Option {
	return commonOption(func(c *commonConfig) { c.maxWait = d })
}

// WithDryRun makes the limiter a dry run, to see what pacing would cost
// before it paces: it books each wait as it would, and reports it
// (EventWait, and EventRefuse for a wait it would refuse, each with DryRun
// set), but lets its caller go at once, refusing nothing. A Transport on a
// dry run heeds nothing a response says (holds, counters, refusals), and
// its quota's cap in flight and the horizons of its classes are not kept:
// the dry run books the schedule the configured limits alone would keep,
// for the traffic as it comes. For traffic whose requests do not wait on
// one another (users' requests, a queue's consumers that do not block on
// pace), its waits are those pacing would impose; a worker that sends one
// request after another would send fewer when paced, and records more.
// A Redis dry run books on keys of its own (its prefix, then "dry-run:"),
// which the fleet's dry runs share and no enforcing limiter reads: a dry
// run beside enforcing replicas does not pace them, and turning it off
// starts from the enforcing schedule, not from the one it booked.
func WithDryRun() Option {
	return commonOption(func(c *commonConfig) { c.dryRun = true })
}

// dryRunPrefix follows a dry run's prefix in its Redis keys.
const dryRunPrefix = "dry-run:"

// WithMaxHold bounds every delay the upstream's word can cause a key: a
// hold (capped at d, with EventHoldCapped), the reset of a window its
// counters steer and the window of a limit learned (a reading of either
// beyond d is ignored, with EventIgnored), the interval a limit learns, and
// the debt of a settlement (an actual cost is capped so that its debt
// delays the key by d at most, with EventSettleCapped). The default is
// DefaultMaxHold, an hour; from 1 ms to MaxDelay.
func WithMaxHold(d time.Duration) Option {
	return commonOption(func(c *commonConfig) { c.maxHold = d })
}

// WithLease sets how long a slot of a cap in flight (Concurrent) lasts
// beyond its holder's last renewal; the default is DefaultLease. A holder
// renews its slots every third of the lease while their requests live, so
// the slots of a process that dies come free within the lease. From 30 ms to
// an hour.
func WithLease(d time.Duration) Option {
	return commonOption(func(c *commonConfig) { c.lease = d })
}

// WithPrefix sets the text every Redis key starts with; the default is
// DefaultPrefix. Limiters with different prefixes do not share buckets.
func WithPrefix(prefix string) Option {
	return redisOption{"WithPrefix", func(c *redisConfig) { c.prefix = prefix }}
}

// WithCallTimeout sets the floor of each Redis call's timeout, whatever the
// request's context and the client's options; the default is
// DefaultCallTimeout. The timeout follows the round trips the limiter
// measures: three smoothed round trips plus four times their deviation (d
// at least), and d at least; a second at most (or d, if longer), and a
// second until Redis first answers. A call gets from its timeout to 1.25
// times it. When it does not answer in time, the request asks again; when
// that call, begun after the first failure, fails too, Redis is taken to be
// away and the limiter handles the request by its FailurePolicy (an error
// that comes at once, such as OOM, is asked three times).
func WithCallTimeout(d time.Duration) Option {
	return redisOption{"WithCallTimeout", func(c *redisConfig) { c.callTimeout = d }}
}

// WithFailurePolicy says what the limiter does while Redis fails; the
// default is FallbackLocal.
func WithFailurePolicy(p FailurePolicy) Option {
	return redisOption{"WithFailurePolicy", func(c *redisConfig) { c.policy = p }}
}

// WithFleetName names the fleet whose processes count one another (by
// heartbeats in Redis) to know their share of the limit should Redis fail.
// Limiters for different upstreams may share a name when the same processes
// run them. The default is "default".
func WithFleetName(name string) Option {
	return redisOption{"WithFleetName", func(c *redisConfig) { c.fleetName = name }}
}

// WithFleetSize pins the number of processes that share the limit, instead
// of counting them by heartbeats. Should Redis fail, each paces at 1/n of the
// limit. Zero, the default, means count.
func WithFleetSize(n int) Option {
	return redisOption{"WithFleetSize", func(c *redisConfig) { c.fleetSize = n }}
}

// WithTokenLeases says whether a key this process waits on often (about
// 800 waits a second, or more) takes its tokens from Redis several at a
// time, one call for a lease of them, instead of one call a wait. A leased
// token is a granted token: the fleet keeps b + r*t exactly, and a token
// not handed out within the lease's span (tens of milliseconds) lapses.
// A lease is at most a share of half the burst as the fleet is counted
// (see WithFleetSize), so a burst under 16 tokens a process leases
// nothing. On by default; off, every wait is one call.
func WithTokenLeases(on bool) Option {
	return redisOption{"WithTokenLeases", func(c *redisConfig) { c.noTokenLeases = !on }}
}

// WithCooldown sets how long a failing Redis is left alone before one
// request probes it again: min after the first failure, doubling (with
// jitter) after each failed probe, up to max. The defaults are
// DefaultMinCooldown and DefaultMaxCooldown.
func WithCooldown(min, max time.Duration) Option {
	return redisOption{"WithCooldown", func(c *redisConfig) { c.minCooldown, c.maxCooldown = min, max }}
}
