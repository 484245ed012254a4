//go:build race

package fleetsim

// Under the race detector a run costs about four times as much: make test
// sweeps fewer seeds there (go test alone sweeps defaultSeeds). And the
// detector shuffles the order in which goroutines run at one instant,
// which a run's replay needs to be the same (the handling of a lost
// reply's closed connection, above all): TestReplay runs without it.
func init() { defaultSeeds, raceDetector = 50, true }
