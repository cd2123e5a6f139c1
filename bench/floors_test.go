package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestFloorsMarkdown renders the floor section from a committed run's
// figures: the floor's own cost and each missed goal's decomposition.
func TestFloorsMarkdown(t *testing.T) {
	raw, err := os.ReadFile("results/20261124-001927/results.json")
	if err != nil {
		t.Skip("the committed run's results.json is not here: ", err)
	}
	var r Results
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	r.floorsMarkdown(func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) })
	out := sb.String()
	for _, want := range []string{"### What is left", "0.34x raw Redis EVALSHA", "- **check**", "- **consume** (per consume)", "operations 0.8", "- **usage**"} {
		if !strings.Contains(out, want) {
			t.Errorf("floor section lacks %q:\n%s", want, out)
		}
	}
	var empty Results
	sb.Reset()
	empty.floorsMarkdown(func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) })
	if sb.Len() != 0 {
		t.Errorf("a run without the ceiling wrote %q", sb.String())
	}
}
