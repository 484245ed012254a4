package pace

import (
	"fmt"
	"strings"
	"time"
)

// An Option configures a Local or a Redis limiter.
type Option interface {
	RedisOption
	applyLocal(*commonConfig)
}

// A RedisOption configures a Redis limiter. Every Option is a RedisOption.
type RedisOption interface {
	applyRedis(*redisConfig)
}

// commonConfig is what both limiters can be told.
type commonConfig struct {
	observer Observer
	maxWait  time.Duration
}

func (c commonConfig) validate() error {
	if c.maxWait < 0 {
		return fmt.Errorf("pace: WithMaxWait(%v): negative", c.maxWait)
	}
	return nil
}

// redisConfig is what a Redis limiter can be told.
type redisConfig struct {
	commonConfig
	prefix string
}

// DefaultPrefix starts the name of every Redis key pace writes, unless
// WithPrefix says otherwise.
const DefaultPrefix = "pace:"

func (c redisConfig) validate() error {
	if strings.ContainsAny(c.prefix, "{}") {
		return fmt.Errorf("pace: WithPrefix(%q): a prefix may not contain '{' or '}', which pace uses for the Redis Cluster hash tag", c.prefix)
	}
	return c.commonConfig.validate()
}

type commonOption func(*commonConfig)

func (o commonOption) applyLocal(c *commonConfig) { o(c) }
func (o commonOption) applyRedis(c *redisConfig)  { o(&c.commonConfig) }

type redisOption func(*redisConfig)

func (o redisOption) applyRedis(c *redisConfig) { o(c) }

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

// WithPrefix sets the text every Redis key starts with; the default is
// DefaultPrefix. Limiters with different prefixes do not share buckets.
func WithPrefix(prefix string) RedisOption {
	return redisOption(func(c *redisConfig) { c.prefix = prefix })
}
