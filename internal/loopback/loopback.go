// Package loopback finds ports on loopback for the servers tests start.
package loopback

import (
	"net"
	"testing"
)

// FreePort returns a port on 127.0.0.1 that nothing listens on now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("loopback: finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
