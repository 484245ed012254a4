// Package redistest starts real redis-server processes on loopback for tests.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/loopback"
	"github.com/fleetpace/pace/internal/tiers"
	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process that a test started. Its methods Kill,
// Restart, Freeze and Thaw inject faults.
type Server struct {
	Addr string // host:port on loopback
	tb   testing.TB
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// startTimeout bounds how long a redis-server may take to accept connections.
const startTimeout = 10 * time.Second

// Start starts a redis-server on a free loopback port, without persistence,
// waits until it answers, and stops it when the test ends. It fails the test,
// saying how to install it, when redis-server is not on PATH. Extra arguments
// go to redis-server's command line (such as "--maxmemory", "1mb").
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return startWith(tb, func() []string { return extra })
}

// startWith is Start, with the extra arguments of each try from extra.
func startWith(tb testing.TB, extra func() []string) *Server {
	tb.Helper()
	bin := tiers.Need(tb, "redis-server", "redis-server")
	// A port free when picked may be taken before redis-server binds it:
	// then it tries another.
	for tries := 1; ; tries++ {
		port := loopback.FreePort(tb)
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			tb:   tb,
			args: append([]string{
				"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
				"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "",
			}, extra()...),
		}
		tb.Cleanup(s.Kill)
		log, ok := s.start(bin)
		if ok || tries == 5 || !strings.Contains(log, "Address already in use") {
			s.started(log, ok)
			return s
		}
	}
}

// started fails the test unless redis-server is ready (ok), with its log.
func (s *Server) started(log string, ok bool) {
	s.tb.Helper()
	if !ok {
		s.tb.Fatalf("redistest: redis-server on %s exited:\n%s", s.Addr, log)
	}
}

// start runs redis-server and waits until it accepts connections, or
// exits: then it returns false with its log.
func (s *Server) start(bin string) (log string, ok bool) {
	s.tb.Helper()
	cmd := exec.Command(bin, s.args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("redistest: starting %s: %v", bin, err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()

	// redis-server says when it is ready (a Sentinel, when it watches its
	// master); its log also tells why it is not.
	ready, exited := make(chan struct{}), make(chan struct{})
	var text strings.Builder // written before ready or exited is closed
	go func() {
		defer close(exited)
		scanner := bufio.NewScanner(stdout)
		waiting := true
		for scanner.Scan() {
			if waiting {
				text.WriteString(scanner.Text() + "\n")
				if line := scanner.Text(); strings.Contains(line, "Ready to accept connections") || strings.Contains(line, "+monitor master") {
					waiting = false
					close(ready)
				}
			}
		}
	}()
	select {
	case <-ready:
		return "", true
	case <-exited:
		return text.String(), false
	case <-time.After(startTimeout):
		s.tb.Fatalf("redistest: redis-server on %s did not become ready within %v", s.Addr, startTimeout)
		return "", false
	}
}

// Kill ends redis-server with SIGKILL, as a crash would, and waits for it.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.ProcessState == nil {
		s.cmd.Process.Signal(syscall.SIGCONT) // a frozen process dies only once thawed
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

// Restart kills redis-server if it runs and starts a new, empty one on the
// same address, and waits until it accepts connections.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.started(s.start(tiers.Need(s.tb, "redis-server", "redis-server")))
}

// Freeze stops redis-server with SIGSTOP: it keeps its connections and
// answers nothing until Thaw.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen redis-server with SIGCONT.
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Errorf("redistest: %v to redis-server: %v", sig, err)
	}
}

// Pid returns the process id of the redis-server.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

// Client returns a go-redis client of s, closed when the test ends, with
// the options pace recommends (ContextTimeoutEnabled).
func (s *Server) Client(tb testing.TB) *redis.Client { return ClientOf(tb, s.Addr) }

// ClientOf returns a go-redis client of the Redis at addr (a Server's, or a
// Proxy's), closed when the test ends, with the options pace recommends
// (ContextTimeoutEnabled).
func ClientOf(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	return c
}

// CommandStat is what INFO commandstats says of one command.
type CommandStat struct {
	Calls       int64   // how many times Redis ran it
	MicrosPerOp float64 // Redis's time per call, in microseconds
}

// CommandStats returns INFO commandstats since the statistics were last
// reset, by command name ("evalsha", "ping"). Commands that scripts run
// inside them count under their own names, so count script round trips with
// ScriptCalls.
func CommandStats(ctx context.Context, c redis.UniversalClient) (map[string]CommandStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := make(map[string]CommandStat)
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var stat CommandStat
		for _, field := range strings.Split(fields, ",") {
			key, value, _ := strings.Cut(field, "=")
			switch key {
			case "calls":
				stat.Calls, err = strconv.ParseInt(value, 10, 64)
			case "usec_per_call":
				stat.MicrosPerOp, err = strconv.ParseFloat(value, 64)
			}
			if err != nil {
				return nil, fmt.Errorf("redistest: commandstats line %q: %v", line, err)
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = stat
	}
	return stats, nil
}

// ScriptCalls is how many of pace's script calls stats count: by FCALL
// (pace's scripts are Redis Functions where Redis has them), EVALSHA or
// EVAL, a library's first load's failed FCALL among them.
func ScriptCalls(stats map[string]CommandStat) int64 {
	return stats["fcall"].Calls + stats["evalsha"].Calls + stats["eval"].Calls
}

// ScriptMicros is Redis's own time per script call that stats count, in
// microseconds.
func ScriptMicros(stats map[string]CommandStat) float64 {
	var total float64
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		total += stats[name].MicrosPerOp * float64(stats[name].Calls)
	}
	return total / float64(max(ScriptCalls(stats), 1))
}
