package main

import (
	"os"
	"testing"
)

func TestScriptCommand(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"evalsha", true}, {"EVALSHA", true}, {"eval", true}, {"evalsha_ro", true}, {"fcall", true},
		{"hgetall", false}, {"xdel", false}, {"script", false}, {"", false},
	} {
		if got := scriptCommand(tc.name); got != tc.want {
			t.Errorf("scriptCommand(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// threadSched reads the main thread's CPU time: a process that has run
// has some, and a process that does not exist is an error.
func TestThreadSched(t *testing.T) {
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Skip("no /proc schedstat")
	}
	run, _, err := threadSched(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if run <= 0 {
		t.Errorf("own main thread: %d ns on a CPU, want > 0", run)
	}
	if _, _, err := threadSched(1 << 30); err == nil {
		t.Error("a missing process: want an error")
	}
}
