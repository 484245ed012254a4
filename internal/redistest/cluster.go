package redistest

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/loopback"
	"github.com/fleetpace/pace/internal/tiers"
	"github.com/redis/go-redis/v9"
)

// Cluster is a real three-master Redis Cluster on loopback that a test
// started: three redis-server processes in cluster mode, joined by
// `redis-cli --cluster create`.
type Cluster struct {
	Addrs   []string
	Servers []*Server
}

// StartCluster starts a three-master cluster, waits until every node says the
// cluster is ok, and stops it when the test ends. It fails the test, saying
// how to install them, when redis-server or redis-cli is not on PATH.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	cli := tiers.Need(tb, "redis-cli", "redis-tools")
	dir := tb.TempDir()
	c := &Cluster{}
	for range 3 {
		// Each node keeps its cluster state in a file of its own; the port is
		// known only once Start picks it, so the file is named after a slot.
		conf := filepath.Join(dir, "nodes-"+strconv.Itoa(len(c.Servers))+".conf")
		// The cluster bus's port is one of its own: by default it is the
		// port 10000 above, which may be taken, or beyond 65535.
		s := startWith(tb, func() []string {
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", conf,
				"--cluster-port", strconv.Itoa(loopback.FreePort(tb)), "--cluster-node-timeout", "5000", "--dir", dir}
		})
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitOK(tb)
	return c
}

// Client returns a go-redis cluster client of c, closed when the test ends,
// with the options pace recommends (ContextTimeoutEnabled).
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { client.Close() })
	return client
}

// waitOK waits until every node reports cluster_state:ok and knows all
// three masters.
func (c *Cluster) waitOK(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(startTimeout)
	for _, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				node.Close()
				tb.Fatalf("redistest: cluster node %s not ok within %v: %v %s", addr, startTimeout, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
		node.Close()
	}
}
