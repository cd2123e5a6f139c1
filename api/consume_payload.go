package api

import (
	"encoding/json"

	"github.com/creditd/creditd/engine"
)

// consumePayload is the body of POST /v1/entitlements/consume.
type consumePayload struct {
	CustomerID        *string `json:"customer_id"`
	BillableMetricKey *string `json:"billable_metric_key"`
	Units             *int64  `json:"units"`
	// Items is the multi-metric form: given instead of billable_metric_key
	// and units, every item is charged or none is.
	Items    []consumeItemPayload `json:"items"`
	Metadata engine.Metadata      `json:"metadata"`
	// DryRun asks what the charge would do without doing it.
	DryRun *bool `json:"dry_run"`
}

// consumeItemPayload is one metric of a multi-metric consume request.
type consumeItemPayload struct {
	BillableMetricKey *string `json:"billable_metric_key"`
	Units             *int64  `json:"units"`
}

func (in *consumePayload) dry() bool { return in.DryRun != nil && *in.DryRun }

// toCommand checks the body in the order the API names its problems:
// customer_id; then the single form's metric, units, metric key line and
// metadata, or the items form's members (not beside the single form's, 1
// to engine.MaxConsumeItems items, metadata.items left to the breakdown),
// its metadata and its items in order. An item's shape problem is carried
// (engine.ConsumeCredits.ItemProblem) with the items before it, whose
// rules the engine checks first, as it did when it checked both in turn.
func (in *consumePayload) toCommand() (engine.ConsumeCredits, error) {
	if in.CustomerID == nil || *in.CustomerID == "" {
		return engine.ConsumeCredits{}, engine.Invalid("customer_id", "customer_id is required")
	}
	out := engine.ConsumeCredits{Customer: *in.CustomerID, Dry: in.dry()}
	if in.Items != nil {
		if err := in.checkItems(&out); err != nil {
			return engine.ConsumeCredits{}, err
		}
		return out, nil
	}
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return engine.ConsumeCredits{}, engine.Invalid("billable_metric_key", "billable_metric_key is required")
	}
	if in.Units == nil {
		return engine.ConsumeCredits{}, engine.Invalid("units", "units is required")
	}
	if err := engine.ConsumeItemUnits.Check("", *in.Units); err != nil {
		return engine.ConsumeCredits{}, err
	}
	if err := engine.CheckLine("billable_metric_key", *in.BillableMetricKey); err != nil {
		return engine.ConsumeCredits{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.ConsumeCredits{}, err
	}
	out.Metric, out.Units, out.Metadata = *in.BillableMetricKey, *in.Units, meta
	return out, nil
}

// checkItems checks the multi-metric form into out.
func (in *consumePayload) checkItems(out *engine.ConsumeCredits) error {
	if in.BillableMetricKey != nil || in.Units != nil {
		return engine.BadRequest("items", "give either items or billable_metric_key and units, not both")
	}
	if err := engine.CheckItemCount(len(in.Items)); err != nil {
		return err
	}
	if _, ok := in.Metadata[engine.ItemsMetadataKey]; ok {
		return engine.BadRequest("metadata."+engine.ItemsMetadataKey,
			"metadata."+engine.ItemsMetadataKey+" is reserved for the item breakdown of a multi-metric consume")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return err
	}
	out.Metadata = meta
	seen := make(map[string]bool, len(in.Items))
	out.Items = make([]engine.ConsumeItem, 0, len(in.Items))
	for i, it := range in.Items {
		metric, units, err := engine.CheckItem(i, it.BillableMetricKey, it.Units, engine.ConsumeItemUnits, seen)
		if err != nil {
			out.ItemProblem = err
			return nil
		}
		out.Items = append(out.Items, engine.ConsumeItem{Metric: metric, Units: units})
	}
	return nil
}

// usagePayload is the body of POST /v1/usage (docs/spec/addendum.md §7).
type usagePayload struct {
	Events []usageEventPayload `json:"events"`
}

// usageEventPayload is one event of a usage batch. Its members' order and
// names are its fingerprint's (engine.UsageRequestHash): frozen.
type usageEventPayload struct {
	EventID           *string         `json:"event_id"`
	CustomerID        *string         `json:"customer_id"`
	BillableMetricKey *string         `json:"billable_metric_key"`
	Units             *int64          `json:"units"`
	Metadata          engine.Metadata `json:"metadata"`
}

// maxEventIDBytes bounds an event_id (docs/spec/addendum.md §7: it is an
// idempotency key, whose limit is 256).
const maxEventIDBytes = 256

// toCommand checks the batch's list; each event's own problems travel
// with it (engine.UsageEvent.Invalid), so one bad event fails alone.
func (in *usagePayload) toCommand() (engine.RecordUsage, error) {
	if in.Events == nil {
		return engine.RecordUsage{}, engine.Invalid("events", "events is required")
	}
	if len(in.Events) > engine.MaxUsageEvents {
		return engine.RecordUsage{}, engine.Invalid("events", "at most 1000 events per call")
	}
	out := engine.RecordUsage{Events: make([]engine.UsageEvent, len(in.Events))}
	for i := range in.Events {
		out.Events[i] = in.Events[i].toEvent()
	}
	return out, nil
}

// toEvent is the event with its fingerprint and its first problem: the
// event_id (given, at most maxEventIDBytes, one line), then what a consume
// body would be refused for.
func (ev *usageEventPayload) toEvent() engine.UsageEvent {
	var out engine.UsageEvent
	if ev.EventID != nil {
		out.EventID = *ev.EventID
	}
	// Marshalling decoded JSON of these types cannot fail.
	b, _ := json.Marshal(ev)
	out.RequestHash = engine.UsageRequestHash(b)
	switch id := out.EventID; {
	case id == "":
		out.Invalid = engine.Invalid("event_id", "event_id is required")
	case len(id) > maxEventIDBytes:
		out.Invalid = engine.Invalid("event_id", "event_id is longer than 256 characters")
	default:
		out.Invalid = engine.CheckLine("event_id", id)
	}
	if out.Invalid != nil {
		return out
	}
	consume := consumePayload{CustomerID: ev.CustomerID, BillableMetricKey: ev.BillableMetricKey, Units: ev.Units, Metadata: ev.Metadata}
	out.Consume, out.Invalid = consume.toCommand()
	return out
}
