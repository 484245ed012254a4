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
// -json and args, and returns what it printed, decoded into T.
func RunJSON[T any](t *testing.T, args ...string) T {
	t.Helper()
	Build(t)
	out, err := exec.Command(binary, append([]string{"-json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	var v T
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s: -json output does not parse: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}
