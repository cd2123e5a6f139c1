package api

import (
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestCataloguePayloads: each bad member of a plan, variant, plan grant or
// entitlement body is a 422 naming it with its detail, the first wrong one
// first; a good body becomes the command.
func TestCataloguePayloads(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		name   string
		check  func() error
		field  string
		detail string
	}{
		{"plan ok", func() error {
			cmd, err := (&CreatePlanPayload{Name: str("Pro")}).ToCommand()
			if err == nil && (cmd.Name != "Pro" || cmd.IsDefault) {
				t.Errorf("plan ok: %+v", cmd)
			}
			return err
		}, "", ""},
		{"plan name missing", func() error { _, err := (&CreatePlanPayload{}).ToCommand(); return err }, "name", "name is required"},
		{"plan name before metadata", func() error {
			_, err := (&CreatePlanPayload{Metadata: engine.Metadata{"": []byte(`"x"`)}}).ToCommand()
			return err
		}, "name", "name is required"},
		{"plan name blank", func() error { _, err := (&CreatePlanPayload{Name: str("  ")}).ToCommand(); return err }, "name", "name must not be empty"},
		{"plan name 200", func() error {
			_, err := (&CreatePlanPayload{Name: str(strings.Repeat("é", 200))}).ToCommand()
			return err
		}, "", ""},
		{"plan name 201", func() error {
			_, err := (&CreatePlanPayload{Name: str(strings.Repeat("n", 201))}).ToCommand()
			return err
		}, "name", "name is longer than 200 characters"},
		{"patch empty", func() error {
			cmd, err := (&UpdatePlanPayload{}).ToCommand()
			if err == nil && (cmd.Name != nil || cmd.Status != nil || cmd.IsDefault != nil || cmd.Metadata != nil) {
				t.Errorf("patch empty: %+v", cmd)
			}
			return err
		}, "", ""},
		{"patch blank name", func() error { _, err := (&UpdatePlanPayload{Name: str("")}).ToCommand(); return err }, "name", "name must not be empty"},
		{"patch bad status", func() error { _, err := (&UpdatePlanPayload{Status: str("archived")}).ToCommand(); return err }, "status", "status must be active or retired"},
		{"patch name before status", func() error {
			_, err := (&UpdatePlanPayload{Name: str(" "), Status: str("archived")}).ToCommand()
			return err
		}, "name", "name must not be empty"},
		{"patch retired", func() error {
			cmd, err := (&UpdatePlanPayload{Status: str("retired")}).ToCommand()
			if err == nil && (cmd.Status == nil || *cmd.Status != engine.PlanRetired) {
				t.Errorf("patch retired: %+v", cmd)
			}
			return err
		}, "", ""},
	}
	for _, tc := range tests {
		err := tc.check()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want ok", tc.name, err)
			}
			continue
		}
		e, ok := engine.AsError(err)
		if !ok || e.Kind != engine.KindValidation || e.Field != tc.field || (tc.detail != "" && e.Detail != tc.detail) {
			t.Errorf("%s: %v, want 422 naming %s (%q)", tc.name, err, tc.field, tc.detail)
		}
	}
}
