package store

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRoundTripsSetTheTimeout: the call timeout from the round trips
// measured, with a floor of 50 ms (or another), on plain samples.
func TestRoundTripsSetTheTimeout(t *testing.T) {
	const ms = time.Millisecond
	for name, tc := range map[string]struct {
		floor time.Duration
		play  func(r *roundTrips)
		least time.Duration
		most  time.Duration
	}{
		"none measured: the ceiling": {50 * ms, func(*roundTrips) {}, time.Second, time.Second},
		"loopback: the floor": {50 * ms, func(r *roundTrips) {
			for range 20 {
				r.answered(100 * time.Microsecond)
			}
		}, 50 * ms, 50*ms + ms},
		"the first of 80 ms: three of it, and four times its deviation of 40 ms": {50 * ms, func(r *roundTrips) { r.answered(80 * ms) }, 400 * ms, 400 * ms},
		"80 ms steadily: three of it, and the floor": {50 * ms, func(r *roundTrips) {
			for range 100 {
				r.answered(80 * ms)
			}
		}, 290 * ms, 291 * ms},
		"a loaded machine, 20 to 60 ms: above the slowest": {50 * ms, func(r *roundTrips) {
			for i := range 200 {
				r.answered(time.Duration(20+40*(i%2)) * ms)
			}
		}, 150 * ms, 260 * ms},
		"a sample beyond the ceiling counts as the ceiling": {50 * ms, func(r *roundTrips) { r.answered(time.Hour) }, time.Second, time.Second},
		"a floor above the ceiling: the floor":              {5 * time.Second, func(r *roundTrips) { r.answered(ms) }, 5 * time.Second, 5 * time.Second},
		"learned on loopback, then two expiries: doubled twice": {50 * ms, func(r *roundTrips) {
			for range 20 {
				r.answered(100 * time.Microsecond)
			}
			expire(r, 1)
			expire(r, 1)
		}, 200 * ms, 204 * ms},
		"calls that expire together, under one timeout, double it once": {50 * ms, func(r *roundTrips) {
			for range 20 {
				r.answered(100 * time.Microsecond)
			}
			expire(r, 16)
		}, 100 * ms, 102 * ms},
		"expiries back off up to the ceiling": {50 * ms, func(r *roundTrips) {
			r.answered(ms)
			for range 12 {
				expire(r, 1)
			}
		}, time.Second, time.Second},
		"the first answer after expiries sets it from its round trip alone, as the first of all": {50 * ms, func(r *roundTrips) {
			for range 20 {
				r.answered(100 * time.Microsecond)
			}
			expire(r, 1)
			expire(r, 1)
			r.answered(80 * ms) // 3 x 80 ms + 4 x 40 ms
		}, 400 * ms, 400 * ms},
		"the answers after it smooth as before": {50 * ms, func(r *roundTrips) {
			expire(r, 1)
			r.answered(80 * ms)
			r.answered(80 * ms) // the deviation falls to 30 ms
		}, 360 * ms, 360 * ms},
	} {
		t.Run(name, func(t *testing.T) {
			r := &roundTrips{floor: tc.floor}
			tc.play(r)
			if got, _ := r.timeout(); got < tc.least || got > tc.most {
				t.Errorf("timeout %v, want %v to %v", got, tc.least, tc.most)
			}
		})
	}
}

// expire has n calls expire under the timeout they began with.
func expire(r *roundTrips, n int) {
	_, backoff := r.timeout()
	for range n {
		r.expired(backoff)
	}
}

// TestAbandonEndsTheCallsUnderWay: a call to a Redis that never answers
// ends when the caller abandons the calls under way, not at its timeout of
// a second: on a client that ignores context deadlines (go-redis's
// defaults, whose calls the caller guards), and on one that applies them,
// once a call has expired (go-redis reads on past a cancelled context).
func TestAbandonEndsTheCallsUnderWay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, reads, never answers
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, conn)
		}
	}()
	for _, deadlines := range []bool{false, true} {
		client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: deadlines})
		defer client.Close()
		c := NewCaller(client, 50*time.Millisecond)
		if deadlines {
			c.trips.expired(0) // a call expired
		}
		done := make(chan time.Time)
		go func() {
			c.Run(context.Background(), checkScript, nil)
			done <- time.Now()
		}()
		time.Sleep(100 * time.Millisecond) // the call under way
		abandoned := time.Now()
		c.Abandon()
		select {
		case ended := <-done:
			if took := ended.Sub(abandoned); took > 500*time.Millisecond {
				t.Errorf("deadlines applied %v: the call ended %v after it was abandoned, want at once", deadlines, took)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("deadlines applied %v: the call did not end", deadlines)
		}
	}
}
