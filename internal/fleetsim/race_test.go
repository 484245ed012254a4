//go:build race

package fleetsim

// Under the race detector a run costs about four times as much: make test
// races the sweep alone, over 15 seeds (go test alone sweeps defaultSeeds),
// and runs the whole package without it. And the detector shuffles the
// order in which goroutines run at one instant, which a run's replay needs
// to be the same (the handling of a lost reply's closed connection, above
// all): TestReplay runs without it.
func init() { defaultSeeds, raceDetector = 15, true }
