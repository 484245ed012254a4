package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestServeWaitClients waits through the wait endpoint with the Python
// and Node clients of examples/, at once: their grants together keep the
// route's bound, and a wait past its timeout raises the language's
// TooLong with the wait it would have had.
func TestServeWaitClients(t *testing.T) {
	redisServer := redistest.Start(t)
	_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nroutes:\n  - {name: work, upstream: 'http://127.0.0.1:1', limit: 10/s burst 2}\n  - {name: slow, path: /slow/, upstream: 'http://127.0.0.1:1', limit: 1/m burst 2}\n", redisServer.Addr))
	commands := [][]string{
		{"python3", "../../examples/python/pace_wait.py", base, "work", "12", "1"},
		{"node", "../../examples/node/pace-wait.mjs", base, "work", "12", "1"},
	}
	var mu sync.Mutex
	var grants []float64
	var wg sync.WaitGroup
	for _, args := range commands {
		wg.Go(func() {
			out, err := exec.Command(args[0], args[1:]...).Output()
			if err != nil {
				t.Errorf("%s: %v", strings.Join(args, " "), err)
			}
			lines := bufio.NewScanner(bytes.NewReader(out))
			for lines.Scan() {
				var line struct{ Granted float64 }
				if json.Unmarshal(lines.Bytes(), &line) != nil || line.Granted == 0 {
					t.Errorf("%s printed %q, want a grant", args[0], lines.Text())
					continue
				}
				mu.Lock()
				grants = append(grants, line.Granted)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(grants) != 24 {
		t.Fatalf("%d grants, want 24", len(grants))
	}
	slices.Sort(grants)
	for i := range grants {
		for j := i; j < len(grants); j++ {
			// one of slack: a grant's time is when its client read it
			if bound := 2 + 10*(grants[j]-grants[i]) + 1; float64(j-i+1) > bound {
				t.Fatalf("%d grants in %.3f s, want <= b + r*t + 1 = %.1f", j-i+1, grants[j]-grants[i], bound)
			}
		}
	}
	t.Logf("24 grants in %.2f s", grants[23]-grants[0])
	resp, err := http.Post(base+waitPath, "application/json", strings.NewReader(`{"route": "slow", "cost": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("taking the slow route's 2 tokens: %s", resp.Status)
	}
	taken := time.Now()
	tooLong := map[string][]string{
		"python3": {"-c", "import sys; sys.path.insert(0, '../../examples/python'); from pace_wait import wait, TooLong\ntry: wait(sys.argv[1], route='slow', timeout=0.01)\nexcept TooLong as e: print(e.retry_after)", base},
		"node":    {"--input-type=module", "-e", "import { wait, TooLong } from '../../examples/node/pace-wait.mjs'; try { await wait(process.argv[1], { route: 'slow', timeout: 0.01 }) } catch (e) { if (e instanceof TooLong) console.log(e.retryAfter) }", base},
	}
	for command, args := range tooLong {
		out, err := exec.Command(command, args...).CombinedOutput()
		var retry float64
		// The wait is what is left of the minute since the tokens were
		// taken, and the second by which the turns after a burst resume
		// late: less the time each client took to start.
		if _, serr := fmt.Sscan(string(out), &retry); err != nil || serr != nil || retry < 60-time.Since(taken).Seconds() || retry > 61 {
			t.Errorf("%s: %v %q, want the TooLong of a wait of what is left of 61 s after %v", command, err, out, time.Since(taken))
		}
	}
}

// TestFirstPythonProgram runs the Python script of docs/first-programs.md,
// exactly as written there, through pace serve on a real Redis: under a
// route of 100/s it fetches its 3 pages; under one of 1/m burst 1 it
// fetches the first, and stops at the second, whose turn is a minute away,
// past its X-Pace-Max-Wait of 30 s.
func TestFirstPythonProgram(t *testing.T) {
	page, err := os.ReadFile("../../docs/first-programs.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(page), "```python\n")
	script, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/first-programs.md has no Python block")
	}
	path := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `[{"number": 1}]`)
	}))
	defer upstream.Close()
	redisServer := redistest.Start(t)
	for limit, want := range map[string]string{
		"100/s":       "page 1: 200, 15 bytes\npage 2: 200, 15 bytes\npage 3: 200, 15 bytes\n",
		"1/m burst 1": "page 1: 200, 15 bytes\nstopping at page 2: its turn is 60 s away\n",
	} {
		_, base := startServe(t, fmt.Sprintf("redis: redis://%s\nprefix: 'py-%d:'\nroutes:\n  - {name: github, upstream: '%s', limit: %s}\n", redisServer.Addr, len(limit), upstream.URL, limit))
		cmd := exec.Command("python3", path)
		cmd.Env = append(os.Environ(), "PACE_URL="+base)
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != want {
			t.Errorf("limit %s: the script printed %q, %v; want %q", limit, out, err, want)
		}
	}
}
