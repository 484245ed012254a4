//go:build race

package fleetsim

// Under the race detector a run costs about four times as much: make test
// sweeps fewer seeds there (go test alone sweeps tierOneSeeds).
func init() { defaultSeeds = 50 }
