package main

import (
	"encoding/json"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestWorstMetaIsAtTheCap: the worst scenario's metadata encodes to exactly
// the size asked, and the API's cap is accepted while one byte more is not,
// so the scenario measures the largest metadata a tenant can send.
func TestWorstMetaIsAtTheCap(t *testing.T) {
	for _, n := range []int{64, 100, 515, 1000, 2048, engine.MaxMetadataBytes - 1, engine.MaxMetadataBytes, engine.MaxMetadataBytes + 1} {
		raw, err := json.Marshal(worstMeta(n, "b12"))
		if err != nil {
			t.Fatal(err)
		}
		var m engine.Metadata
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		c, err := m.Canonical("metadata")
		if n > engine.MaxMetadataBytes {
			if err == nil {
				t.Errorf("worstMeta(%d) was accepted over the cap", n)
			}
			continue
		}
		if err != nil {
			t.Fatalf("worstMeta(%d): %v", n, err)
		}
		enc, _ := json.Marshal(c)
		if len(enc) != n {
			t.Errorf("worstMeta(%d) encodes to %d bytes", n, len(enc))
		}
	}
}
