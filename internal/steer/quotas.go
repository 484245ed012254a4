package steer

import (
	"time"

	"github.com/fleetpace/pace/internal/expiring"
)

// keyQuotas keeps what a process heard of each key's quotas, by name, and
// forgets a key a minute after its last reading. The zero keyQuotas is
// ready; its caller guards it.
type keyQuotas[T any] struct {
	keys expiring.Map[map[string]*T]
}

// of returns key's quotas, heard of at at.
func (k *keyQuotas[T]) of(key string, at time.Time) map[string]*T {
	quotas, _ := k.keys.Get(key)
	if quotas == nil {
		quotas = make(map[string]*T, 1)
	}
	k.keys.Put(key, quotas, at.Add(forgetAfter), at)
	return quotas
}
