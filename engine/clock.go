package engine

import "time"

// SystemClock reads the wall clock.
type SystemClock struct{}

// Now returns the current UTC time truncated to milliseconds, the precision
// every stored instant has.
func (SystemClock) Now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }
