package api

import (
	"encoding/json"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestUsageFingerprintFrozen holds an event's fingerprint to the bytes it
// had before the payload moved out of engine: a changed fingerprint would
// turn every re-sent event into a conflict.
func TestUsageFingerprintFrozen(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{`{"event_id":"ev-1","customer_id":"cus_1","billable_metric_key":"api_calls","units":3}`, "usage-78c039ba1109b03adb4d64d038fdb50f"},
		{`{"metadata":{"b":"x","a":1.5},"units":1,"billable_metric_key":"tokens","customer_id":"9b2f3c4e-1111-4a2b-8c3d-123456789abc","event_id":"ev-2"}`, "usage-da889b4c7184fb6534b79b825ce018a3"},
		{`{"event_id":"ev-3","customer_id":"c","billable_metric_key":"m","units":7,"metadata":{}}`, "usage-99acb018ae1af83efc35b4417d4592b9"},
	} {
		var ev usageEventPayload
		if err := json.Unmarshal([]byte(tc.body), &ev); err != nil {
			t.Fatal(err)
		}
		if got := ev.toEvent().RequestHash; got != tc.want {
			t.Errorf("%s: fingerprint %s, want %s", tc.body, got, tc.want)
		}
	}
}

// TestConsumePayloadFields: each body's first problem names its member,
// in the documented order; a good body becomes the command.
func TestConsumePayloadFields(t *testing.T) {
	for _, tc := range []struct {
		name, body, field string
	}{
		{"no customer", `{"billable_metric_key":"m","units":1}`, "customer_id"},
		{"no metric", `{"customer_id":"c","units":1}`, "billable_metric_key"},
		{"no units", `{"customer_id":"c","billable_metric_key":"m"}`, "units"},
		{"zero units", `{"customer_id":"c","billable_metric_key":"m","units":0}`, "units"},
		{"both forms", `{"customer_id":"c","units":1,"items":[{"billable_metric_key":"m","units":1}]}`, "items"},
		{"no items", `{"customer_id":"c","items":[]}`, "items"},
		{"items metadata", `{"customer_id":"c","items":[{"billable_metric_key":"m","units":1}],"metadata":{"items":1}}`, "metadata.items"},
		{"second item units", `{"customer_id":"c","items":[{"billable_metric_key":"m","units":1},{"billable_metric_key":"n","units":0}]}`, "items[1].units"},
		{"repeated metric", `{"customer_id":"c","items":[{"billable_metric_key":"m","units":1},{"billable_metric_key":"m","units":2}]}`, "items[1].billable_metric_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in consumePayload
			if err := decodeConsume([]byte(tc.body), &in); err != nil {
				t.Fatal(err)
			}
			cmd, err := in.toCommand()
			if err == nil {
				// An item's problem waits for the rules of the items
				// before it (engine's multiConsumeCommand).
				err = cmd.ItemProblem
			}
			if e, ok := engine.AsError(err); !ok || e.Field != tc.field {
				t.Fatalf("error %v, want one naming %s", err, tc.field)
			}
		})
	}
	var in consumePayload
	if err := decodeConsume([]byte(`{"customer_id":"c","items":[{"billable_metric_key":"m","units":2},{"billable_metric_key":"n","units":3}],"dry_run":true}`), &in); err != nil {
		t.Fatal(err)
	}
	cmd, err := in.toCommand()
	if err != nil || cmd.Customer != "c" || !cmd.Dry || len(cmd.Items) != 2 || cmd.Items[1] != (engine.ConsumeItem{Metric: "n", Units: 3}) {
		t.Fatalf("command %+v, %v", cmd, err)
	}
}

// TestUsageEventsFailAlone: an event's problem travels with it, the
// batch's list problems refuse the batch.
func TestUsageEventsFailAlone(t *testing.T) {
	var in usagePayload
	body := `{"events":[{"customer_id":"c","billable_metric_key":"m","units":1},` +
		`{"event_id":"e2","customer_id":"c","billable_metric_key":"m","units":-1},` +
		`{"event_id":"e3","customer_id":"c","billable_metric_key":"m","units":2}]}`
	if err := decodeBody([]byte(body), &in); err != nil {
		t.Fatal(err)
	}
	cmd, err := in.toCommand()
	if err != nil || len(cmd.Events) != 3 {
		t.Fatalf("batch refused: %v", err)
	}
	for i, want := range []string{"event_id", "units", ""} {
		e, _ := engine.AsError(cmd.Events[i].Invalid)
		switch {
		case want == "" && cmd.Events[i].Invalid != nil:
			t.Errorf("event %d: %v", i, cmd.Events[i].Invalid)
		case want != "" && (e == nil || e.Field != want):
			t.Errorf("event %d: %v, want one naming %s", i, cmd.Events[i].Invalid, want)
		}
	}
	if c := cmd.Events[2].Consume; c.Customer != "c" || c.Metric != "m" || c.Units != 2 {
		t.Errorf("event 2's consume: %+v", c)
	}
	if _, err := (&usagePayload{}).toCommand(); err == nil {
		t.Error("a batch without events was accepted")
	}
}

// TestParseUnits: a check's units query is an integer >= 1, 1 when
// missing; anything else is a 400 naming units.
func TestParseUnits(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want int64
		ok   bool
	}{
		{"", 1, true}, {"1", 1, true}, {"42", 42, true}, {"999999999999999999", 999999999999999999, true},
		{"0", 0, false}, {"-1", 0, false}, {"1.5", 0, false}, {"1e3", 0, false}, {"x", 0, false},
		{"9999999999999999999", 0, false}, {" 1", 0, false},
	} {
		got, err := parseUnits(tc.raw)
		e, isErr := engine.AsError(err)
		switch {
		case tc.ok && (err != nil || got != tc.want):
			t.Errorf("%q: %d, %v; want %d", tc.raw, got, err, tc.want)
		case !tc.ok && (!isErr || e.Field != "units"):
			t.Errorf("%q: %d, %v; want a 400 naming units", tc.raw, got, err)
		}
	}
}
