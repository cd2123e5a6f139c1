package api

import (
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestCreateCustomerPayload: each bad member is a 422 naming it, checked in
// the order the API names them; a good body becomes the command.
func TestCreateCustomerPayload(t *testing.T) {
	long := strings.Repeat("x", 201)
	empty, ext, bad, policy := "", "ok", "sometimes", "allow"
	neg, zero := int64(-1), int64(0)
	tests := []struct {
		name  string
		in    createCustomerPayload
		field string
	}{
		{"missing external id", createCustomerPayload{}, "external_id"},
		{"blank external id", createCustomerPayload{ExternalID: &empty}, "external_id"},
		{"long display name", createCustomerPayload{ExternalID: &ext, DisplayName: &long}, "display_name"},
		{"bad policy", createCustomerPayload{ExternalID: &ext, OveragePolicy: &bad}, "overage_policy"},
		{"negative threshold", createCustomerPayload{ExternalID: &ext, LowBalanceThresholdMC: &neg}, "low_balance_threshold_mc"},
		{"first wrong member wins", createCustomerPayload{ExternalID: &ext, OveragePolicy: &bad, LowBalanceThresholdMC: &neg}, "overage_policy"},
		{"good", createCustomerPayload{ExternalID: &ext, DisplayName: &empty, OveragePolicy: &policy, LowBalanceThresholdMC: &zero}, ""},
	}
	for _, tt := range tests {
		cmd, err := tt.in.toCommand()
		if tt.field == "" {
			if err != nil || cmd.ExternalID != ext || cmd.DisplayName != nil || cmd.OveragePolicy == nil || *cmd.OveragePolicy != engine.OveragePolicyAllow {
				t.Errorf("%s: got %+v %v", tt.name, cmd, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindValidation || e.Field != tt.field {
			t.Errorf("%s: want a 422 naming %s, got %v", tt.name, tt.field, err)
		}
	}
}

// TestUpdateCustomerPayload: an empty display name or policy stays (it
// clears the value), an absent one stays nil (it keeps it).
func TestUpdateCustomerPayload(t *testing.T) {
	empty := ""
	cmd, err := (&updateCustomerPayload{DisplayName: &empty, OveragePolicy: &empty}).toCommand()
	if err != nil || cmd.DisplayName == nil || *cmd.DisplayName != "" || cmd.OveragePolicy == nil || *cmd.OveragePolicy != "" {
		t.Fatalf("clearing update: %+v %v", cmd, err)
	}
	cmd, err = (&updateCustomerPayload{}).toCommand()
	if err != nil || cmd.DisplayName != nil || cmd.OveragePolicy != nil || cmd.LowBalanceThresholdMC != nil {
		t.Fatalf("empty update: %+v %v", cmd, err)
	}
}
