package api

import (
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestTopupPayload: each bad member is a 422 (or, for bad text, 400) naming
// it, the first wrong one first; an expiry in the past passes here, as the
// engine refuses it against its clock.
func TestTopupPayload(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	str := func(s string) *string { return &s }
	tests := []struct {
		name  string
		in    topupPayload
		field string
	}{
		{"credits missing", topupPayload{Priority: i64(300)}, "credits"},
		{"credits zero", topupPayload{Credits: i64(0)}, "credits"},
		{"long reference", topupPayload{Credits: i64(1), PaymentReference: str(strings.Repeat("r", 256))}, "payment_reference"},
		{"reference with a newline", topupPayload{Credits: i64(1), PaymentReference: str("a\nb")}, "payment_reference"},
		{"priority", topupPayload{Credits: i64(1), Priority: i64(256), ExpiresAt: str("soon")}, "priority"},
		{"expiry text", topupPayload{Credits: i64(1), ExpiresAt: str("soon")}, "expires_at"},
		{"past expiry", topupPayload{Credits: i64(1), ExpiresAt: str("2000-01-01T00:00:00Z"), PaymentReference: str("")}, ""},
	}
	for _, tt := range tests {
		cmd, err := tt.in.toCommand()
		if tt.field == "" {
			if err != nil || cmd.ExpiresAt == nil || cmd.PaymentReference != nil {
				t.Errorf("%s: %+v %v", tt.name, cmd, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Field != tt.field {
			t.Errorf("%s: got %v, want an error naming %s", tt.name, err, tt.field)
		}
	}
}
