//go:build race

package console_test

// raceSlowdown widens time budgets under the race detector, which slows
// the code it instruments several times over.
const raceSlowdown = 10
