// Package tiers tells the two tiers of pace's tests apart. go test alone
// (tier 1) runs what needs nothing but Go: unit and model tests, the
// examples, and the fleet simulator (internal/fleetsim), the same whatever
// the machine has installed. A test that needs a real part (redis-server,
// nginx, HAProxy, the clients in other languages) or real processes runs
// only under make test (tier 2), which sets AllVar and installs them; there
// a missing program fails its test: no test skipped there counts as passed.
package tiers

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// AllVar is the environment variable make test sets: every test runs.
const AllVar = "PACE_TEST_ALL"

// Need returns the path of the program name, on PATH or in /usr/sbin
// (where Debian puts nginx and HAProxy), under make test; else it skips
// tb, a test of tier 2. Under make test a missing program fails tb,
// naming the Debian package that has it.
func Need(tb testing.TB, name, pkg string) string {
	tb.Helper()
	Full(tb)
	bin, err := find(name)
	if err != nil {
		tb.Fatalf("%s is not installed (%v): install it with `apt-get install -y %s`; make test does", name, err, pkg)
	}
	return bin
}

// Full skips tb unless make test runs it: tb needs real processes or
// real parts, and belongs to tier 2.
func Full(tb testing.TB) {
	tb.Helper()
	if !All() {
		tb.Skipf("a test of real processes and parts: make test runs it (%s=1)", AllVar)
	}
}

// All reports whether every test runs: make test's tier 2.
func All() bool { return os.Getenv(AllVar) != "" }

// find returns the path of the program name, on PATH or in /usr/sbin.
func find(name string) (string, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		if sbin, serr := exec.LookPath(filepath.Join("/usr/sbin", name)); serr == nil {
			return sbin, nil
		}
	}
	return bin, err
}
