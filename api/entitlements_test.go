package api

import (
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestGaugePayload: each bad member is a problem naming it with its kind,
// checked in the order the API names them; a good body becomes the command.
func TestGaugePayload(t *testing.T) {
	zero, two, secs, long := int64(0), int64(2), int64(60), int64(engine.MaxLeaseSeconds+1)
	block, allow, bad := "block", "allow", "sometimes"
	tests := []struct {
		name  string
		in    gaugePayload
		up    bool
		field string
		kind  engine.Kind
		want  engine.GaugeMove
	}{
		{"missing amount", gaugePayload{}, true, "amount", engine.KindBadRequest, engine.GaugeMove{}},
		{"zero amount", gaugePayload{Amount: &zero, Policy: &bad}, true, "amount", engine.KindBadRequest, engine.GaugeMove{}},
		{"bad policy", gaugePayload{Amount: &two, Policy: &bad, LeaseSeconds: &long}, true, "policy", engine.KindBadRequest, engine.GaugeMove{}},
		{"decrement ignores policy", gaugePayload{Amount: &two, Policy: &bad}, false, "", "", engine.GaugeMove{Amount: 2}},
		{"decrement takes no lease", gaugePayload{Amount: &two, LeaseSeconds: &secs}, false, "lease_seconds", engine.KindValidation, engine.GaugeMove{}},
		{"long lease", gaugePayload{Amount: &two, LeaseSeconds: &long}, true, "lease_seconds", engine.KindValidation, engine.GaugeMove{}},
		{"block", gaugePayload{Amount: &two, Policy: &block}, true, "", "", engine.GaugeMove{Amount: 2}},
		{"allow with lease", gaugePayload{Amount: &two, Policy: &allow, LeaseSeconds: &secs}, true, "", "", engine.GaugeMove{Amount: 2, Allow: true, LeaseSeconds: 60}},
	}
	for _, tt := range tests {
		cmd, err := tt.in.toCommand(tt.up)
		if tt.field == "" {
			if err != nil || cmd != tt.want {
				t.Errorf("%s: got %+v %v", tt.name, cmd, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Kind != tt.kind || e.Field != tt.field {
			t.Errorf("%s: want kind %v naming %s, got %v", tt.name, tt.kind, tt.field, err)
		}
	}
}
