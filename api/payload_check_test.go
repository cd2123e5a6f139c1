package api

import (
	"testing"

	"github.com/creditd/creditd/engine"
)

// wantCheck fails t unless err is what a payload check owes: nil when
// field is "", else an engine error of kind naming field and, when detail
// is not "", saying detail. The payload table tests share it.
func wantCheck(t *testing.T, name string, err error, kind engine.Kind, field, detail string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Errorf("%s: %v, want ok", name, err)
		}
		return
	}
	e, ok := engine.AsError(err)
	if !ok || e.Kind != kind || e.Field != field || (detail != "" && e.Detail != detail) {
		t.Errorf("%s: %v, want a %v naming %s (%q)", name, err, kind, field, detail)
	}
}
