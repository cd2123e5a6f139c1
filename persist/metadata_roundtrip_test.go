package persist

import (
	"encoding/json"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestMetadataSurvivesJSONB states that metadata keeps its exact bytes
// through Postgres (invariant 5: rebuild restores blocks exactly): the
// canonical form the door writes equals the canonical form of what jsonb
// gives back, numbers, member order and escapes included.
func TestMetadataSurvivesJSONB(t *testing.T) {
	b := setup(t)
	cases := []string{
		`{"a": 1}`,
		`{"n": 1e2, "m": 1E+2, "k": 1.50e1, "j": 1e-3, "i": -0, "h": -0.0, "g": 0.000}`,
		`{"big": 9223372036854775808, "neg": -12.5e-3, "tiny": 123.456e-10, "huge": 7e300}`,
		`{"nested": {"zz": [1, 2.0, {"b": "<&>", "a": "\u2028 é \"q\" \\ \t"}], "a": null}, "tag": true}`,
		`{"plan": "pro", "n": 75, "tag": "h", "nested": {"k": ["v", 1]}}`,
	}
	for _, in := range cases {
		var m engine.Metadata
		if err := json.Unmarshal([]byte(in), &m); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		door, err := m.Canonical("metadata")
		if err != nil {
			t.Fatalf("%s: Canonical: %v", in, err)
		}
		doorText, _ := json.Marshal(door)
		var stored []byte
		if err := b.pool.QueryRow(b.ctx, `SELECT $1::jsonb`, string(doorText)).Scan(&stored); err != nil {
			t.Fatalf("%s: jsonb: %v", in, err)
		}
		var back engine.Metadata
		if err := json.Unmarshal(stored, &back); err != nil {
			t.Fatalf("%s: read back %s: %v", in, stored, err)
		}
		for k, v := range back {
			if back[k], err = engine.CanonicalValue(v); err != nil {
				t.Fatalf("%s: CanonicalValue(%s): %v", in, v, err)
			}
		}
		backText, _ := json.Marshal(back)
		if string(backText) != string(doorText) {
			t.Errorf("%s:\n door  %s\n jsonb %s\n back  %s", in, doorText, stored, backText)
		}
	}
}
