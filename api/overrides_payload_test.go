package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestOverridePayloads: each bad member of an override body is a 400 naming
// it with its detail, the first wrong one first; a null value on PATCH is
// carried for the engine to name after the subscription.
func TestOverridePayloads(t *testing.T) {
	str := func(s string) *string { return &s }
	cap1 := json.RawMessage(`{"cap":1}`)
	long := strings.Repeat("r", engine.MaxOverrideReasonChars+1)
	tests := []struct {
		name   string
		check  func() error
		field  string
		detail string
	}{
		{"create ok", func() error {
			cmd, err := (&createOverridePayload{BillableMetricKey: str("seats"), Value: cap1, ExpiresAt: str("2030-01-02T03:04:05.123456+02:00")}).toCommand()
			want := time.Date(2030, 1, 2, 1, 4, 5, 123e6, time.UTC)
			if err == nil && (cmd.BillableMetricKey != "seats" || cmd.ExpiresAt == nil || !cmd.ExpiresAt.Equal(want) || cmd.ExpiresAt.Location() != time.UTC) {
				t.Errorf("create ok: %+v", cmd)
			}
			return err
		}, "", ""},
		{"create key missing", func() error { _, err := (&createOverridePayload{Value: cap1}).toCommand(); return err }, "billable_metric_key", "billable_metric_key is required"},
		{"create key empty", func() error {
			_, err := (&createOverridePayload{BillableMetricKey: str(""), Value: cap1}).toCommand()
			return err
		}, "billable_metric_key", "billable_metric_key is required"},
		{"create value missing", func() error {
			_, err := (&createOverridePayload{BillableMetricKey: str("seats")}).toCommand()
			return err
		}, "value", "value is required"},
		{"create value null", func() error {
			_, err := (&createOverridePayload{BillableMetricKey: str("seats"), Value: json.RawMessage(`null`)}).toCommand()
			return err
		}, "value", "value is required"},
		{"create reason before expiry", func() error {
			_, err := (&createOverridePayload{BillableMetricKey: str("seats"), Value: cap1, Reason: &long, ExpiresAt: str("tomorrow")}).toCommand()
			return err
		}, "reason", "reason is longer than 1000 characters"},
		{"create bad expires_at", func() error {
			_, err := (&createOverridePayload{BillableMetricKey: str("seats"), Value: cap1, ExpiresAt: str("tomorrow")}).toCommand()
			return err
		}, "expires_at", "expires_at must be an RFC 3339 date-time"},
		{"update empty", func() error {
			cmd, err := (&updateOverridePayload{}).toCommand()
			if err == nil && (cmd.SetExpiry || cmd.Value != nil || cmd.ValueErr != nil) {
				t.Errorf("update empty: %+v", cmd)
			}
			return err
		}, "", ""},
		{"update expires_at null", func() error {
			cmd, err := (&updateOverridePayload{ExpiresAt: json.RawMessage(`null`)}).toCommand()
			if err == nil && (!cmd.SetExpiry || cmd.ExpiresAt != nil) {
				t.Errorf("update expires_at null: %+v", cmd)
			}
			return err
		}, "", ""},
		{"update expires_at not a string", func() error {
			_, err := (&updateOverridePayload{ExpiresAt: json.RawMessage(`12`)}).toCommand()
			return err
		},
			"expires_at", "expires_at must be an RFC 3339 date-time or null"},
		{"update reason first", func() error {
			_, err := (&updateOverridePayload{Reason: &long, ExpiresAt: json.RawMessage(`12`)}).toCommand()
			return err
		}, "reason", "reason is longer than 1000 characters"},
		{"update null value carried", func() error {
			cmd, err := (&updateOverridePayload{Value: json.RawMessage(`null`)}).toCommand()
			if err != nil {
				return err
			}
			return cmd.ValueErr
		}, "value", "value cannot be null; omit it to keep the value"},
		{"update expiry before null value", func() error {
			_, err := (&updateOverridePayload{Value: json.RawMessage(`null`), ExpiresAt: json.RawMessage(`"x"`)}).toCommand()
			return err
		}, "expires_at", "expires_at must be an RFC 3339 date-time"},
	}
	for _, tc := range tests {
		wantCheck(t, tc.name, tc.check(), engine.KindBadRequest, tc.field, tc.detail)
	}
}
