// Package exampleproc runs an example as a fleet of processes: copies of
// the program, each told its job in an environment variable, each printing
// one JSON report on its stdout.
package exampleproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
)

// envelope is what a worker prints: its report, or why it has none.
type envelope[R any] struct {
	Report R
	Err    string
}

// Worker makes the process a worker when env is set: it reads the job from
// env, runs it, prints its report and exits, 1 on an error. When env is not
// set, Worker returns, and the program goes on as the one that starts the
// workers.
func Worker[J, R any](env string, run func(J) (R, error)) {
	spec, ok := os.LookupEnv(env)
	if !ok {
		return
	}
	var job J
	var out envelope[R]
	err := json.Unmarshal([]byte(spec), &job)
	if err == nil {
		out.Report, err = run(job)
	}
	if err != nil {
		out.Err = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(out)
	if err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// Start starts a copy of this program for each job, with the job in env
// (see Worker); their stderr is this program's. Wait returns the reports in
// the order of the jobs, once every worker has ended.
func Start[J, R any](env string, jobs []J) (wait func() ([]R, error), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	reports := make([]R, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, job := range jobs {
		spec, err := json.Marshal(job)
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			cmd := exec.Command(self)
			cmd.Env = append(os.Environ(), env+"="+string(spec))
			var stdout bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
			runErr := cmd.Run()
			var out envelope[R]
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || runErr != nil || out.Err != "" {
				errs[i] = fmt.Errorf("worker %d: %v %v %s", i, runErr, err, out.Err)
			}
			reports[i] = out.Report
		})
	}
	return func() ([]R, error) {
		wg.Wait()
		return reports, errors.Join(errs...)
	}, nil
}

// Main checks a demo's flags (check), runs it (run) and prints its summary:
// as one JSON object when asJSON, else by print. A bad flag exits with 2, a
// failed run with 1, each saying why on stderr after the program's name.
func Main[S any](name string, check func() error, run func() (S, error), asJSON bool, print func(S, io.Writer)) {
	if err := check(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	s, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
	if asJSON {
		json.NewEncoder(os.Stdout).Encode(s)
		return
	}
	print(s, os.Stdout)
}
