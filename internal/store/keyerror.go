package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A KeyError reports that what Redis holds for one key is not what pace
// wrote there; the package pace exports it (pace.KeyError).
type KeyError struct {
	Key      string // the key, as the caller named it
	RedisKey string // the Redis key at fault
	Problem  string // what is wrong there
}

// Error names the key, the Redis key and the problem.
func (e *KeyError) Error() string {
	return fmt.Sprintf("pace: key %s: Redis key %s %s", QuoteKey(e.Key), QuoteKey(e.RedisKey), e.Problem)
}

// IsOutage tells a failure of Redis, which the failure policy handles, from
// an error about one key's data, which the caller gets as it is: another
// Redis would not help.
func IsOutage(err error) bool {
	if err == nil {
		return false
	}
	var keyErr *KeyError
	return !errors.As(err, &keyErr)
}

// keyErrorMarker starts the error a script raises about one key's data (see
// lua/common.lua), followed by the index of the key in KEYS.
const keyErrorMarker = "PACEKEY "

// fail turns the error of script's call for key into a *KeyError when the
// script raised one about keys, and otherwise names the key and script.
func (s *Store) fail(key, script string, keys []string, err error) error {
	i, problem, ok := keyErrorOf(err)
	if !ok {
		return &CallError{Key: key, Script: script, Err: err}
	}
	keyErr := &KeyError{Key: key, Problem: problem}
	if i >= 1 && i <= len(keys) {
		keyErr.RedisKey = keys[i-1]
	}
	return keyErr
}

// keyErrorOf reads a script's error about one of its keys: the key's
// index in KEYS (from 1; 0 when unreadable) and what is wrong there.
func keyErrorOf(err error) (index int, problem string, ok bool) {
	var redisErr redis.Error
	if !errors.As(err, &redisErr) {
		return 0, "", false
	}
	rest, ok := strings.CutPrefix(redisErr.Error(), keyErrorMarker)
	if !ok {
		return 0, "", false
	}
	text, problem, _ := strings.Cut(rest, " ")
	problem, _, _ = strings.Cut(problem, " script: ") // Redis names the script after the message
	index, _ = strconv.Atoi(text)
	return index, problem, true
}

// A CallError is a script call for a key that failed: Redis did not
// answer, or answered with an error about itself (OOM, BUSY, LOADING).
type CallError struct {
	Key    string // the key, as the caller named it
	Script string // such as "reserve"
	Err    error
}

// Error names the key, the script and the failure.
func (e *CallError) Error() string { return "pace: key " + QuoteKey(e.Key) + ": " + e.Call() }

// Call names the script and the failure, without the key.
func (e *CallError) Call() string { return e.Script + " script: " + e.Err.Error() }

// Unwrap returns the failure.
func (e *CallError) Unwrap() error { return e.Err }

// QuoteKey quotes a key for a message: whole when short, else its first
// 64 bytes and its length, so that a megabyte key does not make a megabyte
// error.
func QuoteKey(key string) string {
	const shown = 64
	if len(key) <= shown {
		return strconv.Quote(key)
	}
	return strconv.Quote(key[:shown]) + "... (" + strconv.Itoa(len(key)) + " bytes)"
}
