// Package exampletest runs an example in its tests as its users do: built
// without the race detector (whose slowness would be measured too), as a
// program, reading its -json output.
package exampletest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// Build builds the example in the test's directory, once: a test that
// times something from before RunJSON runs it builds it first.
func Build(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pace-example")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "example")
		if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
			buildErr = err
			t.Logf("%s", out)
		}
	})
	if buildErr != nil {
		t.Fatalf("building the example: %v", buildErr)
	}
}

// RunJSON builds the example in the test's directory, once, runs it with
// -json and args, and returns what it printed, decoded into T. A line of
// go-redis's own log on its stderr is an error: the examples quiet it.
func RunJSON[T any](t *testing.T, args ...string) T {
	t.Helper()
	Build(t)
	cmd := exec.Command(binary, append([]string{"-json"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	for line := range strings.Lines(stderr.String()) {
		if strings.HasPrefix(line, "redis: ") {
			t.Errorf("%s: the example printed go-redis's log, which it should quiet: %q", strings.Join(args, " "), line)
			break
		}
	}
	var v T
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s: -json output does not parse: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}
