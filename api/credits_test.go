package api

import (
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestCreditsPayloads: a bad adjust member is a 422 naming it, the first
// wrong one first, as is a bad grant member; a bad history bound is a 400
// naming it.
func TestCreditsPayloads(t *testing.T) {
	str := func(s string) *string { return &s }
	i64 := func(v int64) *int64 { return &v }
	tests := []struct {
		name  string
		check func() error
		kind  engine.Kind
		field string
	}{
		{"delta missing", func() error { _, err := (&adjustPayload{Source: str("nope")}).toCommand(); return err }, engine.KindValidation, "delta"},
		{"delta zero", func() error { _, err := (&adjustPayload{Delta: i64(0)}).toCommand(); return err }, engine.KindValidation, "delta"},
		{"source", func() error { _, err := (&adjustPayload{Delta: i64(-5), Source: str("nope")}).toCommand(); return err }, engine.KindValidation, "source"},
		{"reason", func() error {
			_, err := (&adjustPayload{Delta: i64(-5), Source: str("manual"), Reason: str(" ")}).toCommand()
			return err
		}, engine.KindValidation, "reason"},
		{"good adjust", func() error {
			cmd, err := (&adjustPayload{Delta: i64(-5), Source: str("manual"), Reason: str("fix")}).toCommand()
			if err == nil && (cmd.Delta != -5 || cmd.Source != engine.SourceManual || cmd.Reason != "fix") {
				t.Errorf("good adjust: %+v", cmd)
			}
			return err
		}, "", ""},
		{"grant credits", func() error { _, err := (&GrantPayload{Source: str("nope")}).ToCommand(); return err }, engine.KindValidation, "credits"},
		{"grant both ends", func() error {
			_, err := (&GrantPayload{Credits: i64(1), Source: str("manual"), Reason: str("r"), ExpiresAt: str("x"), DurationSeconds: i64(5)}).ToCommand()
			return err
		}, engine.KindValidation, "expires_at"},
		{"grant fallback", func() error {
			_, err := (&GrantPayload{Credits: i64(1), Source: str("manual"), Reason: str("r"), DurationSeconds: i64(5),
				StackAfter: &stackAfterPayload{MetadataMatch: engine.Metadata{}, Fallback: str("later")}}).ToCommand()
			return err
		}, engine.KindValidation, "stack_after.fallback"},
		{"grant stack after an expiry is deferred", func() error {
			cmd, err := (&GrantPayload{Credits: i64(1), Source: str("manual"), Reason: str("r"), ExpiresAt: str("2000-01-01T00:00:00Z"),
				StackAfter: &stackAfterPayload{}}).ToCommand()
			if e, _ := engine.AsError(cmd.StackErr); err == nil && (cmd.ExpiresAt == nil || e == nil || e.Field != "duration_seconds") {
				t.Errorf("deferred stack error: %+v", cmd)
			}
			return err
		}, "", ""},
		{"history from", func() error { _, err := (&HistoryParams{From: "yesterday", To: "soon"}).ToQuery(); return err }, engine.KindBadRequest, "from"},
		{"history to", func() error {
			_, err := (&HistoryParams{From: "2026-01-01T00:00:00Z", To: "soon"}).ToQuery()
			return err
		}, engine.KindBadRequest, "to"},
		{"good history", func() error {
			q, err := (&HistoryParams{Type: "consumption", Limit: 5}).ToQuery()
			if err == nil && (q.Type == nil || q.Source != nil || q.From != nil || q.Limit != 5) {
				t.Errorf("good history: %+v", q)
			}
			return err
		}, "", ""},
	}
	for _, tt := range tests {
		err := tt.check()
		e, _ := engine.AsError(err)
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: got %v", tt.name, err)
		case tt.field != "" && (e == nil || e.Kind != tt.kind || e.Field != tt.field):
			t.Errorf("%s: got %v, want a %s naming %s", tt.name, err, tt.kind, tt.field)
		}
	}
}
