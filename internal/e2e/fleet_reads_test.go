package e2e

import (
	"strconv"
	"testing"

	"github.com/creditd/creditd/internal/app"
)

// TestReadsSeeWritesOfAnotherNode (issue 25): two nodes share Redis and
// Postgres, each with its own persister, and every request goes to the node
// the previous one did not. Each read Postgres answers (history, overage,
// customer and tenant usage, reservations, the events page, the webhook
// events list) sees every write acknowledged before it, whichever node
// took the write and whichever persister stores it: the read waits for the
// outbox as it stood when the read came in.
func TestReadsSeeWritesOfAnotherNode(t *testing.T) {
	t.Parallel()
	first := NewStack(t, SingleNode())
	second := NewStack(t, SingleNode(), WithRedis(first.Redis, first.Prefix), WithDatabase(first.DatabaseURL),
		WithConfig(func(c *app.Config) { c.Consumer = "e2e-second" }))
	tn := first.NewTenant(uniq("fleet-reads"))
	nodes := []api{first.as(t, tn.Live), second.as(t, tn.Live)}
	n := 0
	next := func() api { n++; return nodes[n%2] }

	id, _ := next().newCustomer()
	metric := next().perUnit(10)
	next().grant(id, map[string]any{"credits": 1000})
	const rounds = 8
	for i := 1; i <= rounds; i++ {
		wantStatus(t, next().do("POST", "/v1/entitlements/consume", "fr-"+strconv.Itoa(i),
			map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 2}), 200, "consume")
		wantStatus(t, next().do("POST", "/v1/reservations", "fr-hold-"+strconv.Itoa(i),
			map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 1}), 201, "reserve")

		if got := len(next().history(id, "?type=consumption&limit=100")); got != i {
			t.Fatalf("round %d: history shows %d consumptions", i, got)
		}
		reservations := next().get("/v1/customers/" + id + "/reservations?limit=100")
		wantStatus(t, reservations, 200, "reservations")
		if got := len(arr(t, reservations.Body["data"], "reservations")); got != i {
			t.Fatalf("round %d: %d reservations listed", i, got)
		}
		consumed := 0
		for _, e := range next().alertEvents() {
			if e["event_type"] == "credit.consumed" && e["customer_id"] == id {
				consumed++
			}
		}
		if consumed != i {
			t.Fatalf("round %d: the events page holds %d credit.consumed", i, consumed)
		}
		if got := len(next().eventsOfType("credit.consumed", id)); got != i {
			t.Fatalf("round %d: the webhook events list holds %d credit.consumed", i, got)
		}
	}
}
