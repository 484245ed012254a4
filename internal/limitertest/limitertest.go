// Package limitertest starts real rate limiters that no one here wrote, on
// loopback, for tests: nginx's limit_req and HAProxy's stick tables, each
// before a static answer, from Debian's packages (make test installs
// nginx-light and haproxy when they are missing).
package limitertest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/loopback"
	"github.com/fleetpace/pace/internal/tiers"
)

// Nginx starts nginx on a free loopback port, limiting every request to
// rate a second with a burst of burst, nodelay (what limit_req refuses, it
// answers 429, and does not count), before a static file; and stops it when
// the test ends. It returns the URL.
func Nginx(tb testing.TB, rate, burst int) string {
	tb.Helper()
	return StartNginx(tb, rate, burst).URL
}

// NginxWithRetryAfter starts nginx as Nginx does, and each of its 429s
// says Retry-After: retryAfter (seconds), as most APIs' do.
func NginxWithRetryAfter(tb testing.TB, rate, burst, retryAfter int) string {
	tb.Helper()
	return startNginx(tb, rate, burst, retryAfter).URL
}

// NginxServer is an nginx that StartNginx started: SetRate reloads it at
// another rate.
type NginxServer struct {
	URL                     string
	tb                      testing.TB
	dir                     string
	port, burst, retryAfter int
	cmd                     *exec.Cmd
}

// StartNginx starts nginx as Nginx does, and returns it.
func StartNginx(tb testing.TB, rate, burst int) *NginxServer {
	tb.Helper()
	return startNginx(tb, rate, burst, 0)
}

func startNginx(tb testing.TB, rate, burst, retryAfter int) *NginxServer {
	tb.Helper()
	n := &NginxServer{tb: tb, dir: workDir(tb, "nginx"), port: loopback.FreePort(tb), burst: burst, retryAfter: retryAfter}
	if err := os.WriteFile(filepath.Join(n.dir, "index.html"), []byte("ok\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	n.URL = fmt.Sprintf("http://127.0.0.1:%d/", n.port)
	n.cmd = run(tb, "nginx", n.dir, n.conf(rate), n.port, "-p", n.dir, "-c", filepath.Join(n.dir, "limiter.conf"))
	return n
}

// SetRate rewrites nginx's configuration at rate a second, and has it
// reload it (SIGHUP): new workers take the requests from then on, within
// a few milliseconds.
func (n *NginxServer) SetRate(rate int) {
	if err := os.WriteFile(filepath.Join(n.dir, "limiter.conf"), []byte(n.conf(rate)), 0o644); err != nil {
		n.tb.Error(err)
		return
	}
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		n.tb.Errorf("limitertest: reloading nginx: %v", err)
	}
}

// conf is nginx's configuration at rate a second. A Retry-After of 0 is
// none: the map's empty value adds no header.
func (n *NginxServer) conf(rate int) string {
	retryAfter := ""
	if n.retryAfter > 0 {
		retryAfter = strconv.Itoa(n.retryAfter)
	}
	// A "return" would answer in the rewrite phase, before limit_req: the
	// file goes through it.
	return fmt.Sprintf(`worker_processes 1;
daemon off;
error_log %[1]s/error.log;
pid %[1]s/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  limit_req_zone $server_name zone=api:1m rate=%[3]dr/s;
  map $status $retry_after { 429 "%[5]s"; default ""; }
  server {
    listen 127.0.0.1:%[2]d;
    server_name api;
    root %[1]s;
    location / {
      limit_req zone=api burst=%[4]d nodelay;
      limit_req_status 429;
      add_header Retry-After $retry_after always;
      try_files /index.html =404;
    }
  }
}
`, n.dir, n.port, rate, n.burst, retryAfter)
}

// HAProxy starts HAProxy on a free loopback port, denying with a 429 the
// requests while its estimate of the last second's requests (its
// http_req_rate(1s), which counts the requests it denies too) is above
// limit, and answering 200 to the others; and stops it when the test ends.
// It returns the URL.
func HAProxy(tb testing.TB, limit int) string {
	tb.Helper()
	return HAProxyWithRetryAfter(tb, limit, 0)
}

// HAProxyWithRetryAfter starts HAProxy as HAProxy does, and each of its
// 429s says Retry-After: retryAfter (seconds; 0 for none).
func HAProxyWithRetryAfter(tb testing.TB, limit, retryAfter int) string {
	tb.Helper()
	header := ""
	if retryAfter > 0 {
		header = fmt.Sprintf(" hdr Retry-After %d", retryAfter)
	}
	dir := workDir(tb, "haproxy")
	port := loopback.FreePort(tb)
	conf := fmt.Sprintf(`global
  maxconn 1000
defaults
  mode http
  timeout connect 1s
  timeout client 10s
  timeout server 10s
frontend api
  bind 127.0.0.1:%d
  stick-table type string len 8 size 10 expire 10s store http_req_rate(1s)
  http-request track-sc0 str(api)
  http-request deny deny_status 429%s if { sc_http_req_rate(0) gt %d }
  http-request return status 200
`, port, header, limit)
	run(tb, "haproxy", dir, conf, port, "-db", "-f", filepath.Join(dir, "limiter.conf"))
	return fmt.Sprintf("http://127.0.0.1:%d/", port)
}

// startTimeout bounds how long a limiter may take to answer.
const startTimeout = 10 * time.Second

// packages are the Debian packages of the limiters.
var packages = map[string]string{"nginx": "nginx-light", "haproxy": "haproxy"}

// run writes conf to dir, runs the program name with args, waits until it
// accepts connections on port (a connection is no request: neither limiter
// counts it), and stops it when the test ends.
func run(tb testing.TB, name, dir, conf string, port int, args ...string) *exec.Cmd {
	tb.Helper()
	if err := os.WriteFile(filepath.Join(dir, "limiter.conf"), []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	bin := tiers.Need(tb, name, packages[name])
	out, err := os.Create(filepath.Join(dir, "output.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("limitertest: starting %s: %v", bin, err)
	}
	exited := make(chan struct{}) // closed once the program has exited, with waitErr
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		// SIGTERM: nginx's master stops its workers too (a SIGKILL left
		// them running, orphans); SIGKILL if it does not end within 5 s.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		out.Close()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "output.log"))
			errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			tb.Fatalf("limitertest: %s exited: %v\n%s%s", name, waitErr, log, errLog)
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return cmd
		}
		if time.Now().After(deadline) {
			tb.Fatalf("limitertest: %s did not accept connections on %s within %v: %v", name, addr, startTimeout, err)
		}
	}
}

// workDir returns a new directory for a limiter's files, which its worker
// processes (nginx's run as nobody when started by root) can read, removed
// when the test ends.
func workDir(tb testing.TB, name string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "pace-"+name)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
