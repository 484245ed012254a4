package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/fleetpace/pace/internal/loopback"
	"github.com/fleetpace/pace/internal/tiers"
	"github.com/redis/go-redis/v9"
)

// Sentinel is a master, its replica and a Redis Sentinel that watches
// them, under MasterName, on loopback: Master.Kill makes the Sentinel
// promote the replica, within about a second.
type Sentinel struct {
	Master, Replica, Sentinel *Server
	MasterName                string
}

// StartSentinel starts a master, a replica of it, and a Sentinel that takes
// the master for down after 300 ms, and stops them when the test ends.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	s := &Sentinel{MasterName: "pace"}
	s.Master = Start(tb)
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	s.Replica = Start(tb, "--replicaof", host, port)
	bin := tiers.Need(tb, "redis-server", "redis-server")
	sport := loopback.FreePort(tb)
	conf := filepath.Join(tb.TempDir(), "sentinel.conf") // Sentinel rewrites it
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %[2]s 300\nsentinel failover-timeout %[2]s 2000\n",
		sport, s.MasterName, host, port)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	s.Sentinel = &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(sport)), tb: tb, args: []string{conf, "--sentinel"}}
	tb.Cleanup(s.Sentinel.Kill)
	s.Sentinel.started(s.Sentinel.start(bin))
	return s
}

// Client returns a go-redis failover client of the Sentinel's master, with
// the options pace recommends, closed when the test ends.
func (s *Sentinel) Client(tb testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: []string{s.Sentinel.Addr}, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	return c
}
