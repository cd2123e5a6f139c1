//go:build !race

package console_test

// raceSlowdown is 1 without the race detector.
const raceSlowdown = 1
