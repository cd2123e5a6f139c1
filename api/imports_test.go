package api

import (
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestImportCallLimits: a call past the customers or blocks per call limit
// is a 422 naming customers.
func TestImportCallLimits(t *testing.T) {
	one := int64(1)
	many := func(rows, blocksEach int) importPayload {
		in := importPayload{Customers: make([]importCustomerPayload, rows)}
		for i := range in.Customers {
			ext := uuid.NewString()
			in.Customers[i].ExternalID = &ext
			for j := 0; j < blocksEach; j++ {
				in.Customers[i].Credits = append(in.Customers[i].Credits, importCreditPayload{Credits: &one})
			}
		}
		return in
	}
	for _, tc := range []struct {
		name string
		in   importPayload
	}{
		{"no customers member", importPayload{}},
		{"too many customers", many(engine.MaxImportCustomers+1, 0)},
		{"too many blocks in all", many(engine.MaxImportTotalBlocks/engine.MaxImportBlocks+1, engine.MaxImportBlocks)},
	} {
		_, err := tc.in.toCommand()
		if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindValidation || e.Field != "customers" {
			t.Errorf("%s: err %v, want a 422 naming customers", tc.name, err)
		}
	}
}

// TestImportRowShape: a row's first wrong member is its error, and the
// blocks before it stay for the engine's expiry check.
func TestImportRowShape(t *testing.T) {
	ext, blank, past, bad := "a", " ", "2000-01-01T00:00:00Z", "soon"
	one, zero, big := int64(1), int64(0), int64(300)
	maxInt := int64(1<<63 - 1)
	tests := []struct {
		name   string
		in     importCustomerPayload
		field  string
		blocks int
	}{
		{"blank external id", importCustomerPayload{ExternalID: &blank}, "external_id", 0},
		{"zero credits", importCustomerPayload{ExternalID: &ext, Credits: []importCreditPayload{{Credits: &one, ExpiresAt: &past}, {Credits: &zero}}}, "credits[1].credits", 1},
		{"overflow", importCustomerPayload{ExternalID: &ext, Credits: []importCreditPayload{{Credits: &maxInt}, {Credits: &one}}}, "credits[1].credits", 1},
		{"priority", importCustomerPayload{ExternalID: &ext, Credits: []importCreditPayload{{Credits: &one, Priority: &big}}}, "credits[0].priority", 0},
		{"expiry text", importCustomerPayload{ExternalID: &ext, Credits: []importCreditPayload{{Credits: &one, ExpiresAt: &bad}}}, "credits[0].expires_at", 0},
		{"good", importCustomerPayload{ExternalID: &ext, Credits: []importCreditPayload{{Credits: &one, ExpiresAt: &past}}}, "", 1},
	}
	for _, tt := range tests {
		row := tt.in.toRow()
		e, _ := engine.AsError(row.Err)
		switch {
		case tt.field == "" && row.Err != nil, tt.field != "" && (e == nil || e.Field != tt.field):
			t.Errorf("%s: err %v, want field %q", tt.name, row.Err, tt.field)
		case len(row.Blocks) != tt.blocks:
			t.Errorf("%s: %d blocks kept, want %d", tt.name, len(row.Blocks), tt.blocks)
		}
	}
}
