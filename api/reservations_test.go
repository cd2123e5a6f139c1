package api

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestReservePayload: each bad body names the first wrong member with its
// kind, in the order the API checks them; a good body becomes the command.
func TestReservePayload(t *testing.T) {
	id, ext, empty, m, ctl := "c1", "e1", "", "m", "a\x01b"
	zero, two, big := int64(0), int64(2), int64(engine.MaxReservationTTLSeconds+1)
	item := func(metric *string, units *int64) reserveItemPayload {
		return reserveItemPayload{BillableMetricKey: metric, EstimatedUnits: units}
	}
	tests := []struct {
		name  string
		in    reservePayload
		field string
		kind  engine.Kind
		want  engine.CreateReservation
	}{
		{"no customer", reservePayload{}, "customer_id", engine.KindBadRequest, engine.CreateReservation{}},
		{"both customers", reservePayload{CustomerID: &id, ExternalCustomerID: &ext}, "customer_id", engine.KindBadRequest, engine.CreateReservation{}},
		{"empty ids are none", reservePayload{CustomerID: &empty, ExternalCustomerID: &empty}, "customer_id", engine.KindBadRequest, engine.CreateReservation{}},
		{"no metric", reservePayload{CustomerID: &id, TTLSeconds: &big}, "billable_metric_key", engine.KindValidation, engine.CreateReservation{}},
		{"no units", reservePayload{CustomerID: &id, BillableMetricKey: &m}, "estimated_units", engine.KindValidation, engine.CreateReservation{}},
		{"zero units", reservePayload{CustomerID: &id, BillableMetricKey: &m, EstimatedUnits: &zero}, "estimated_units", engine.KindValidation, engine.CreateReservation{}},
		{"ttl before the key line", reservePayload{CustomerID: &id, BillableMetricKey: &ctl, EstimatedUnits: &two, TTLSeconds: &big}, "ttl_seconds", engine.KindValidation, engine.CreateReservation{}},
		{"control character in the key", reservePayload{CustomerID: &id, BillableMetricKey: &ctl, EstimatedUnits: &two}, "billable_metric_key", engine.KindBadRequest, engine.CreateReservation{}},
		{"bad metadata", reservePayload{CustomerID: &id, BillableMetricKey: &m, EstimatedUnits: &two, Metadata: engine.Metadata{"": json.RawMessage(`"x"`)}}, "metadata", engine.KindValidation, engine.CreateReservation{}},
		{"items beside the single form", reservePayload{CustomerID: &id, EstimatedUnits: &two, Items: []reserveItemPayload{}}, "items", engine.KindBadRequest, engine.CreateReservation{}},
		{"no items", reservePayload{CustomerID: &id, Items: []reserveItemPayload{}}, "items", engine.KindBadRequest, engine.CreateReservation{}},
		{"item without units", reservePayload{CustomerID: &id, TTLSeconds: &big, Items: []reserveItemPayload{item(&m, &two), item(&ext, nil)}}, "items[1].estimated_units", engine.KindValidation, engine.CreateReservation{}},
		{"repeated item", reservePayload{CustomerID: &id, Items: []reserveItemPayload{item(&m, &two), item(&m, &two)}}, "items[1].billable_metric_key", engine.KindBadRequest, engine.CreateReservation{}},
		{"items then ttl", reservePayload{CustomerID: &id, TTLSeconds: &zero, Items: []reserveItemPayload{item(&m, &two)}}, "ttl_seconds", engine.KindValidation, engine.CreateReservation{}},
		{"single", reservePayload{CustomerID: &id, BillableMetricKey: &m, EstimatedUnits: &two}, "", "",
			engine.CreateReservation{Customer: engine.CustomerRef{Value: id}, Metric: m, EstimatedUnits: 2, TTLSeconds: engine.DefaultReservationTTLSeconds}},
		{"items by external id", reservePayload{ExternalCustomerID: &ext, TTLSeconds: &two, Items: []reserveItemPayload{item(&m, &two)}}, "", "",
			engine.CreateReservation{Customer: engine.CustomerRef{Value: ext, Strict: true}, TTLSeconds: 2, Items: []engine.ReserveItem{{Metric: m, EstimatedUnits: 2}}}},
	}
	for _, tt := range tests {
		cmd, err := tt.in.toCommand()
		if tt.field == "" {
			if err != nil || !reflect.DeepEqual(cmd, tt.want) {
				t.Errorf("%s: got %+v %v", tt.name, cmd, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Kind != tt.kind || e.Field != tt.field {
			t.Errorf("%s: want kind %v naming %s, got %v", tt.name, tt.kind, tt.field, err)
		}
	}
}

// TestCommitPayload: without actual_units or items the command carries
// UnitsMissing for the engine to name the member the reservation needs; other bad
// bodies name the first wrong member; a good body becomes the command.
func TestCommitPayload(t *testing.T) {
	m, n := "m", "n"
	neg, zero, two := int64(-1), int64(0), int64(2)
	item := func(metric *string, units *int64) commitItemPayload {
		return commitItemPayload{BillableMetricKey: metric, ActualUnits: units}
	}
	bad := engine.Metadata{"": json.RawMessage(`"x"`)}
	yes, no := true, false
	tests := []struct {
		name  string
		in    commitPayload
		field string
		kind  engine.Kind
		want  engine.CommitReservation
	}{
		{"nothing, bad metadata unchecked", commitPayload{Metadata: bad}, "", "", engine.CommitReservation{UnitsMissing: true}},
		{"negative units", commitPayload{ActualUnits: &neg, Metadata: bad}, "actual_units", engine.KindValidation, engine.CommitReservation{}},
		{"bad metadata", commitPayload{ActualUnits: &zero, Metadata: bad}, "metadata", engine.KindValidation, engine.CommitReservation{}},
		{"both forms", commitPayload{ActualUnits: &two, Items: []commitItemPayload{item(&m, &two)}}, "items", engine.KindBadRequest, engine.CommitReservation{}},
		{"no items", commitPayload{Items: []commitItemPayload{}}, "items", engine.KindBadRequest, engine.CommitReservation{}},
		{"negative item", commitPayload{Items: []commitItemPayload{item(&m, &two), item(&n, &neg)}, Metadata: bad}, "items[1].actual_units", engine.KindValidation, engine.CommitReservation{}},
		{"items then metadata", commitPayload{Items: []commitItemPayload{item(&m, &two)}, Metadata: bad}, "metadata", engine.KindValidation, engine.CommitReservation{}},
		{"single", commitPayload{ActualUnits: &zero}, "", "", engine.CommitReservation{}},
		{"final true is a commit", commitPayload{ActualUnits: &two, Final: &yes}, "", "", engine.CommitReservation{ActualUnits: 2}},
		{"partial", commitPayload{ActualUnits: &two, Final: &no}, "", "", engine.CommitReservation{ActualUnits: 2, Partial: true}},
		{"partial without units", commitPayload{Final: &no}, "", "", engine.CommitReservation{UnitsMissing: true, Partial: true}},
		{"partial of 0 units", commitPayload{ActualUnits: &zero, Final: &no}, "actual_units", engine.KindValidation, engine.CommitReservation{}},
		{"partial with items", commitPayload{Items: []commitItemPayload{item(&m, &two)}, Final: &no}, "final", engine.KindValidation, engine.CommitReservation{}},
		{"items", commitPayload{Items: []commitItemPayload{item(&m, &zero), item(&n, &two)}}, "", "",
			engine.CommitReservation{Items: []engine.CommitItem{{Metric: m}, {Metric: n, ActualUnits: 2}}}},
	}
	for _, tt := range tests {
		cmd, err := tt.in.toCommand()
		if tt.field == "" {
			if err != nil || !reflect.DeepEqual(cmd, tt.want) {
				t.Errorf("%s: got %+v %v", tt.name, cmd, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Kind != tt.kind || e.Field != tt.field {
			t.Errorf("%s: want kind %v naming %s, got %v", tt.name, tt.kind, tt.field, err)
		}
	}
}

// TestExtendPayload: an extend needs additional_units, ttl_seconds or both,
// each within the create's bounds; a bad one is a 422 naming it.
func TestExtendPayload(t *testing.T) {
	neg, zero, two, big := int64(-1), int64(0), int64(2), int64(engine.MaxReservationTTLSeconds+1)
	tests := []struct {
		name  string
		in    extendPayload
		field string
		want  engine.ExtendReservation
	}{
		{"nothing", extendPayload{}, "additional_units", engine.ExtendReservation{}},
		{"zero units", extendPayload{AdditionalUnits: &zero}, "additional_units", engine.ExtendReservation{}},
		{"negative units", extendPayload{AdditionalUnits: &neg, TTLSeconds: &two}, "additional_units", engine.ExtendReservation{}},
		{"zero ttl", extendPayload{TTLSeconds: &zero}, "ttl_seconds", engine.ExtendReservation{}},
		{"ttl past a day", extendPayload{AdditionalUnits: &two, TTLSeconds: &big}, "ttl_seconds", engine.ExtendReservation{}},
		{"top up", extendPayload{AdditionalUnits: &two}, "", engine.ExtendReservation{AdditionalUnits: 2}},
		{"prolong", extendPayload{TTLSeconds: &two}, "", engine.ExtendReservation{TTLSeconds: 2}},
		{"both", extendPayload{AdditionalUnits: &two, TTLSeconds: &two}, "", engine.ExtendReservation{AdditionalUnits: 2, TTLSeconds: 2}},
	}
	for _, tt := range tests {
		cmd, err := tt.in.toCommand()
		if tt.field == "" {
			if err != nil || cmd != tt.want {
				t.Errorf("%s: got %+v %v", tt.name, cmd, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindValidation || e.Field != tt.field {
			t.Errorf("%s: want a 422 naming %s, got %v", tt.name, tt.field, err)
		}
	}
}
