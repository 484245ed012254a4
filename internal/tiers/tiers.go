// Package tiers tells the two tiers of pace's tests apart. go test alone
// runs what needs nothing installed, and skips, saying why, a test that
// needs a program the machine lacks (redis-server, nginx, HAProxy...);
// make test, as CI runs it, sets AllVar and installs them, and there a
// missing program fails its test: no test skipped there counts as passed.
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
// (where Debian puts nginx and HAProxy), or ends tb: skipped, unless
// AllVar is set, and then failed, either way naming the Debian package
// that has it.
func Need(tb testing.TB, name, pkg string) string {
	tb.Helper()
	bin, err := find(name)
	if err != nil {
		if os.Getenv(AllVar) != "" {
			tb.Fatalf("%s is not installed (%v): install it with `apt-get install -y %s`; make test does", name, err, pkg)
		}
		tb.Skipf("%s is not installed: this test runs under make test, which installs %s", name, pkg)
	}
	return bin
}

// Runs reports whether the tests that Need name run: it is installed, or
// AllVar is set (and a missing one fails them).
func Runs(name string) bool {
	_, err := find(name)
	return err == nil || os.Getenv(AllVar) != ""
}

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
