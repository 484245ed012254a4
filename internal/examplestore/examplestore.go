// Package examplestore gives the examples a Redis limiter: on the Redis a
// URL names, or, with no URL, on an embedded Redis-protocol store, so that
// every example runs with nothing installed.
package examplestore

import (
	"context"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace"
)

// Limiter returns a Redis limiter of quota on the Redis at url (an
// embedded store when url is ""), with the client options pace recommends,
// and a function that closes the limiter, the client and the store.
func Limiter(url string, quota pace.Quota, opts ...pace.Option) (*pace.Redis, func(), error) {
	var store *miniredis.Miniredis
	if url == "" {
		var err error
		if store, err = miniredis.Run(); err != nil {
			return nil, nil, err
		}
		url = "redis://" + store.Addr()
	}
	closeStore := func() {
		if store != nil {
			store.Close()
		}
	}
	options, err := redis.ParseURL(url)
	if err != nil {
		closeStore()
		return nil, nil, err
	}
	options.ContextTimeoutEnabled = true // so that pace's call timeout needs no goroutine
	QuietRedis()
	client := redis.NewClient(options)
	limiter, err := pace.NewRedis(client, quota, opts...)
	if err != nil {
		client.Close()
		closeStore()
		return nil, nil, err
	}
	return limiter, func() {
		limiter.Close()
		client.Close()
		closeStore()
	}, nil
}

// QuietRedis drops go-redis's own log lines (a dial error for each
// connection it tries while Redis is away): an example's observer says
// what happened, once.
func QuietRedis() { redis.SetLogger(quiet{}) }

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
