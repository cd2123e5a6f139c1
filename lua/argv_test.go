package lua

import (
	"encoding/json"
	"testing"
)

// TestJSONStringAsMarshal: jsonString writes what json.Marshal writes.
func TestJSONStringAsMarshal(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain-key_01", "a\"b", `a\b`, "<&>", "tab\there", "é", "\u2028", "\xff", "~ ok!"} {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := jsonString(s)
		if err != nil || got != string(want) {
			t.Errorf("jsonString(%q) = %s, %v; want %s", s, got, err, want)
		}
	}
}
