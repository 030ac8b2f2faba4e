//go:build race

package bench_test

// raceEnabled reports a build with the race detector.
const raceEnabled = true
