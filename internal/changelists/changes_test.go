package changelists

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
)

// changes are the three lists of docs/design.md, each made as its example
// says: a cost type `package` (unit_cost per started package of
// package_size units), an event type `credit.refunded` (a grant whose
// reason is "refund"), an endpoint GET /v1/customers/{id}/credits/summary.
func changes() []change {
	return []change{costTypeChange(), eventTypeChange(), endpointChange()}
}

// regenerate is the regeneration after an edit of api/openapi.json, one
// step per command as the lists name them; driftTests and drift fail when
// the list left one out. A client whose tools are missing here (no npm ci,
// no python3) is neither regenerated nor checked: logged, not failed.
func regenerate() []step {
	return []step{
		runStep("go", "run", "./internal/apidoc"),
		runStep("go", "generate", "./client"),
		{name: "npm --prefix clients/typescript run generate", apply: func(s *scratch) error {
			if !s.nodeModules() {
				s.t.Log("TypeScript client not regenerated: clients/typescript/node_modules is missing (npm ci there)")
				return nil
			}
			return s.cmd("npm", "--prefix", "clients/typescript", "run", "generate")
		}},
		{name: "python3 clients/python/scripts/generate.py", apply: func(s *scratch) error {
			if _, err := exec.LookPath("python3"); err != nil {
				s.t.Log("Python client not regenerated: python3 is not installed")
				return nil
			}
			return s.cmd("python3", "clients/python/scripts/generate.py")
		}},
	}
}

// drift is the --check of the TypeScript and Python clients' generators;
// docs/api.md and client/*_gen.go are checked by go tests (driftTests).
func drift() []command {
	var out []command
	if _, err := exec.LookPath("python3"); err == nil {
		out = append(out, command{args: []string{"python3", "clients/python/scripts/generate.py", "--check"}})
	}
	out = append(out, command{args: []string{"npm", "--prefix", "clients/typescript", "run", "check-generated"}, ts: true})
	return out
}

// nodeModules links the TypeScript client's npm packages into the copy
// (copyTree leaves node_modules out); false when the tree has none.
func (s *scratch) nodeModules() bool {
	nm := filepath.Join(s.root, "clients", "typescript", "node_modules")
	if _, err := os.Stat(nm); err != nil {
		return false
	}
	if s.exists("clients/typescript/node_modules") {
		return true
	}
	return os.Symlink(nm, s.path("clients/typescript/node_modules")) == nil
}

const driftTests = "TestReferenceUpToDate|TestRenderCoversTheDocument|TestEveryBodyHasAnExample|TestGeneratedUpToDate"

// nextMigration is the file name of a new migration: one number past the
// highest in persist/migrations.
func nextMigration(s *scratch, slug string) (string, error) {
	entries, err := os.ReadDir(s.path("persist/migrations"))
	if err != nil {
		return "", err
	}
	num := regexp.MustCompile(`^(\d+)_`)
	var nums []int
	for _, e := range entries {
		if m := num.FindStringSubmatch(e.Name()); m != nil {
			n, _ := strconv.Atoi(m[1])
			nums = append(nums, n)
		}
	}
	sort.Ints(nums)
	return fmt.Sprintf("persist/migrations/%03d_%s.up.sql", nums[len(nums)-1]+1, slug), nil
}

func costTypeChange() change {
	return change{
		heading: "Adding a cost type",
		steps: append([]step{
			{"engine/pricing.go", func(s *scratch) error {
				return s.edit("engine/pricing.go",
					after("\tCostTiered  CostType = \"tiered\"", "\n\tCostPackage CostType = \"package\""),
					after("\tUnitCost          int64       `json:\"unit_cost\"`",
						"\n\tPackageSize       int64       `json:\"package_size,omitempty\"`"),
					before("\tcase CostTiered:\n\t\tif r.TierConfig == nil",
						"\tcase CostPackage:\n\t\tif r.PackageSize < 1 {\n\t\t\treturn 0, &Error{Kind: KindInternal, Detail: \"package rule without package_size\"}\n\t\t}\n"+
							"\t\treturn mulChecked(r.UnitCost, units/r.PackageSize+min(units%r.PackageSize, 1))\n"),
					repl{"\tcase CostFlat, CostPerUnit, CostTiered:\n", "\tcase CostFlat, CostPerUnit, CostTiered, CostPackage:\n"},
					before("\tif r.CostType != CostTiered {\n\t\treturn nil\n\t}",
						"\tif r.CostType == CostPackage && r.PackageSize < 1 {\n\t\treturn Invalid(\"package_size\", \"package_size is required and must be >= 1 for package\")\n\t}\n"))
			}},
			{"engine/pricing_test.go", func(s *scratch) error {
				return s.appendTo("engine/pricing_test.go", `
func TestPricePackage(t *testing.T) {
	r := MeteringRule{CostType: CostPackage, UnitCost: 7, PackageSize: 5}
	for units, want := range map[int64]int64{1: 7, 5: 7, 6: 14, 11: 21} {
		if got, err := Price(r, units); err != nil || got != want {
			t.Errorf("Price(%d) = %d, %v; want %d", units, got, err, want)
		}
	}
	if err := ValidateRule(MeteringRule{CostType: CostPackage, UnitCost: 7}); err == nil {
		t.Error("a package rule without package_size passed ValidateRule")
	}
}
`)
			}},
			{"engine/commands.go", func(s *scratch) error {
				return s.edit("engine/commands.go",
					after("\tUnitCost   int64       `json:\"unit_cost\"`", "\n\tPackageSize int64 `json:\"package_size,omitempty\"`"),
					repl{"UnitCost: r.UnitCost, TierConfig: r.TierConfig}", "UnitCost: r.UnitCost, TierConfig: r.TierConfig, PackageSize: r.PackageSize}"})
			}},
			{"engine/metering.go", func(s *scratch) error {
				return s.edit("engine/metering.go",
					after("\tTierConfig        *TierConfig // nil unless tiered", "\n\tPackageSize       int64       // 0 unless package"),
					repl{"TierConfig: in.TierConfig, EffectiveFrom: now", "TierConfig: in.TierConfig, PackageSize: in.PackageSize, EffectiveFrom: now"})
			}},
			{"api/pricing.go", func(s *scratch) error {
				return s.edit("api/pricing.go",
					after("\tUnitCost          *int64             `json:\"unit_cost\"`", "\n\tPackageSize       *int64             `json:\"package_size\"`"),
					after("\tif in.UnitCost != nil {\n\t\tr.UnitCost = *in.UnitCost\n\t}",
						"\n\tif in.PackageSize != nil {\n\t\tr.PackageSize = *in.PackageSize\n\t}"),
					repl{"UnitCost: r.UnitCost, TierConfig: r.TierConfig, Metadata: meta}", "UnitCost: r.UnitCost, TierConfig: r.TierConfig, PackageSize: r.PackageSize, Metadata: meta}"})
			}},
			{"api/pricing_payload_test.go", func(s *scratch) error {
				return s.edit("api/pricing_payload_test.go",
					before("\t\t{\"rule good\", func() error {",
						"\t\t{\"rule package without size\", func() error {\n\t\t\t_, err := (&rulePayload{BillableMetricKey: str(\"api\"), CostType: str(\"package\"), UnitCost: i64(7)}).toCommand()\n\t\t\treturn err\n\t\t}, \"package_size\"},\n"))
			}},
			{"lua/hotpath.go", func(s *scratch) error {
				return s.edit("lua/hotpath.go",
					repl{"if t.CostType != engine.CostTiered || units < 1 {", "if t.CostType != engine.CostTiered && t.CostType != engine.CostPackage || units < 1 {"},
					repl{"TierConfig: t.TierConfig}, units)", "TierConfig: t.TierConfig, PackageSize: t.PackageSize}, units)"})
			}},
			{"persist/migrations/NNN_*.up.sql", func(s *scratch) error {
				name, err := nextMigration(s, "package_cost")
				if err != nil {
					return err
				}
				return os.WriteFile(s.path(name), []byte(`-- A package rule's units per package.
ALTER TABLE metering_rules ADD COLUMN package_size BIGINT NOT NULL DEFAULT 0 CHECK (package_size >= 0);
ALTER TABLE metering_rules DROP CONSTRAINT metering_rules_cost_type_check;
ALTER TABLE metering_rules ADD CONSTRAINT metering_rules_cost_type_check
    CHECK (cost_type IN ('flat', 'per_unit', 'tiered', 'package'));
`), 0o644)
			}},
			{"persist/catalog.go", func(s *scratch) error {
				return s.edit("persist/catalog.go",
					repl{"effective_from, effective_until, metadata, created_at, updated_at`", "effective_from, effective_until, metadata, created_at, updated_at, package_size`"},
					repl{"&meta, &r.CreatedAt, &r.UpdatedAt); err != nil", "&meta, &r.CreatedAt, &r.UpdatedAt, &r.PackageSize); err != nil"},
					repl{"$9, NULL, $10, $11, $12)`", "$9, NULL, $10, $11, $12, $13)`"},
					repl{"tiers, r.EffectiveFrom, rMeta, r.CreatedAt, r.UpdatedAt)", "tiers, r.EffectiveFrom, rMeta, r.CreatedAt, r.UpdatedAt, r.PackageSize)"})
			}},
			{"api/openapi.json", func(s *scratch) error {
				return s.openapi(func(doc *jnode) error {
					for _, schema := range []string{"MeteringRule", "RuleInput"} {
						props := doc.at("components", "schemas", schema, "properties")
						enum := props.at("cost_type", "enum")
						if enum == nil {
							return fmt.Errorf("no cost_type enum in %s", schema)
						}
						enum.insertAfter(`"tiered"`, mustJSON(`"package"`))
						props.set("package_size", mustJSON(`{"type": "integer", "format": "int64", "minimum": 1, "description": "Units per package; required for package."}`), "unit_cost")
					}
					return nil
				})
			}},
		}, regenerate()...),
		probes: map[string]string{
			"lua/zz_changelist_probe_test.go": `package lua

import (
	"context"
	"testing"

	"github.com/creditd/creditd/engine"
)

// The script that charges takes a package rule's price.
func TestChangelistProbe(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		c, _ := b.funded(t)
		terms := engine.RuleTerms{CostType: engine.CostPackage, UnitCost: 7, PackageSize: 5}
		res, err := b.store.Consume(context.Background(), consumeCmd(c, 11, terms, engine.OveragePolicyBlock, t0))
		if err != nil {
			t.Fatal(err)
		}
		if u := res.Mutation.Usage; u == nil || u.Charged != 21 {
			t.Fatalf("usage %+v, want 21 charged (3 packages of 7)", u)
		}
	})
}
`,
			"api/zz_changelist_probe_test.go": `package api

import "testing"

// A package rule is accepted and prices a check.
func TestChangelistProbe(t *testing.T) {
	h := setupPricing(t)
	r := h.do("POST", "/v1/metering-rules", ` + "`" + `{"billable_metric_key":"pkg","cost_type":"package","unit_cost":7,"package_size":5}` + "`" + `, h.idemKey("p1")...)
	if r.status != 201 || r.json()["package_size"] != float64(5) {
		t.Fatalf("create rule: %d %s", r.status, r.body)
	}
	c := h.do("GET", "/v1/entitlements/check?customer_id=c1&billable_metric_key=pkg&units=11", "", h.key()...)
	if c.status != 200 || c.json()["estimated_cost"] != float64(21) {
		t.Fatalf("check: %d %s", c.status, c.body)
	}
}
`,
			"engine/zz_changelist_probe_test.go": `package engine

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// api/openapi.json describes a package rule: the name and its field, in
// the rule the API answers and in the body it takes.
func TestChangelistProbe(t *testing.T) {
	raw, err := os.ReadFile("../api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string ` + "`json:\"enum\"`" + `
				} ` + "`json:\"properties\"`" + `
			} ` + "`json:\"schemas\"`" + `
		} ` + "`json:\"components\"`" + `
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"MeteringRule", "RuleInput"} {
		props := doc.Components.Schemas[name].Properties
		if _, ok := props["package_size"]; !ok || !slices.Contains(props["cost_type"].Enum, string(CostPackage)) {
			t.Errorf("api/openapi.json %s does not describe cost type %s and package_size", name, CostPackage)
		}
	}
}
`,
			"persist/zz_changelist_probe_test.go": `package persist

import (
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// A package rule is stored and read back whole.
func TestChangelistProbe(t *testing.T) {
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	r := rule(live, "pkg", 7, now)
	r.CostType, r.PackageSize = engine.CostPackage, 5
	if err := b.store.CreateRule(b.ctx, r, metric(live, "pkg", engine.MetricMetered, now)); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.ActiveRule(b.ctx, live, "pkg")
	if err != nil || got.CostType != engine.CostPackage || got.PackageSize != 5 {
		t.Fatalf("ActiveRule = %+v, %v", got, err)
	}
}
`,
		},
		vet:      []string{"./engine", "./lua", "./api", "./persist"},
		run:      "TestChangelistProbe|TestPricePackage|TestPricingPayloads|TestLuaNamesAreGoNames|TestOpenAPIMatchesRoutes|" + driftTests,
		testPkgs: []string{"./engine", "./lua", "./api", "./persist", "./internal/apidoc", "./client/internal/gen"},
		checks:   drift(),
	}
}

func eventTypeChange() change {
	return change{
		heading: "Adding an event type",
		steps: append([]step{
			{"engine/events.go", func(s *scratch) error {
				if err := s.edit("engine/events.go",
					after("\tEventTestPing            EventType = \"test.ping\"",
						"\n\t// EventCreditRefunded fires for a grant whose reason is \"refund\".\n\tEventCreditRefunded EventType = \"credit.refunded\""),
					after("\t\tadd(SlotMain, EventCreditGranted, GrantedData{TransactionID: e.ID, Credits: e.Delta,\n\t\t\tSource: e.Source, Reason: e.Reason, BalanceAfter: after, LedgerEntry: e})",
						"\n\t\tif e.Reason != nil && *e.Reason == \"refund\" {\n\t\t\tadd(RefundSlot(0), EventCreditRefunded, RefundedData{TransactionID: e.ID, Credits: e.Delta})\n\t\t}")); err != nil {
					return err
				}
				return s.appendTo("engine/events.go", `
// RefundedData is the data of credit.refunded.
type RefundedData struct {
	TransactionID uuid.UUID `+"`json:\"transaction_id\"`"+`
	Credits       int64     `+"`json:\"credits\"`"+`
}
`)
			}},
			{"engine/event_ids.go", func(s *scratch) error {
				if err := s.edit("engine/event_ids.go",
					after("\teventsBudget\n", "\teventsRefund\n"),
					repl{`eventsBudget: "budget"}`, `eventsBudget: "budget", eventsRefund: "refund"}`}); err != nil {
					return err
				}
				return s.appendTo("engine/event_ids.go", `
// RefundSlot is the slot of the Mutation's credit.refunded.
func RefundSlot(i int) EventSlot { return EventSlot{eventsRefund, i} }
`)
			}},
			{"engine/event_ids_test.go", func(s *scratch) error {
				return s.edit("engine/event_ids_test.go",
					repl{"slots := []EventSlot{SlotMain, SlotLowBalance, SlotExhausted, SlotTopupRequested}",
						"slots := []EventSlot{SlotMain, SlotLowBalance, SlotExhausted, SlotTopupRequested, RefundSlot(0)}"})
			}},
			{"engine/events_test.go", func(s *scratch) error {
				return s.edit("engine/events_test.go",
					before("\t\t{\"gauge\", mut(MutationGaugeKind, 0, 0, 100, \"\", nil), nil},",
						"\t\t{\"refund\", func() Mutation {\n\t\t\tm := mut(MutationGrant, 0, 500, 100, \"\", nil, mainEntry(500, EntryAdjustment))\n\t\t\tr := \"refund\"\n\t\t\tm.Entries[0].Reason = &r\n\t\t\treturn m\n\t\t}(), []EventType{granted, EventCreditRefunded}},\n"))
			}},
			{"api/openapi.json", func(s *scratch) error {
				return s.openapi(func(doc *jnode) error {
					schemas, hooks := doc.at("components", "schemas"), doc.at("webhooks")
					if schemas == nil || hooks == nil || hooks.at("credit.expired") == nil {
						return fmt.Errorf("no components.schemas or webhooks[credit.expired]")
					}
					schemas.set("CreditRefundedData", mustJSON(`{"type": "object", "description": "A grant that refunds: its ledger entry and credits.",
						"properties": {"transaction_id": {"type": "string", "format": "uuid"}, "credits": {"type": "integer", "format": "int64"}},
						"required": ["transaction_id", "credits"]}`), "")
					schemas.set("CreditRefundedEvent", mustJSON(`{"allOf": [{"$ref": "#/components/schemas/WebhookEnvelope"},
						{"type": "object", "properties": {"event_type": {"const": "credit.refunded"}, "data": {"$ref": "#/components/schemas/CreditRefundedData"}}}],
						"description": "The delivered body of credit.refunded."}`), "")
					hook := mustJSON(string(hooks.at("credit.expired").encode()))
					post := hook.at("post")
					post.set("operationId", mustJSON(`"onCreditRefunded"`), "")
					post.set("summary", mustJSON(`"credit.refunded"`), "")
					post.set("description", mustJSON(`"A grant whose reason is refund."`), "")
					media := post.at("requestBody", "content", "application/json")
					media.set("schema", mustJSON(`{"$ref": "#/components/schemas/CreditRefundedEvent"}`), "")
					ex := media.at("example")
					ex.set("event_type", mustJSON(`"credit.refunded"`), "")
					ex.set("data", mustJSON(`{"transaction_id": "5d2c1b0a-9e8f-5a7b-8c6d-3e2f1a0b9c8d", "credits": 750}`), "")
					hooks.set("credit.refunded", hook, "credit.expired")
					return nil
				})
			}},
			{"docs/rules.md", func(s *scratch) error {
				return s.edit("docs/rules.md", repl{"`credit.budget_reached` (a budget reached its limit: once per budget and period), ",
					"`credit.budget_reached` (a budget reached its limit: once per budget and period), `credit.refunded` (a refund grant), "})
			}},
		}, regenerate()...),
		probes: map[string]string{
			"engine/zz_changelist_probe_test.go": `package engine

import (
	"encoding/json"
	"os"
	"testing"
)

// A refund grant owes credit.refunded, with an id of its own that a replay
// derives again, and its data in the envelope; api/openapi.json documents
// its delivery.
func TestChangelistProbe(t *testing.T) {
	m := mut(MutationGrant, 0, 500, 100, "", nil, mainEntry(500, EntryAdjustment))
	r := "refund"
	m.Entries[0].Reason = &r
	evs := EventsOf(m)
	if len(evs) != 2 || evs[1].EventType != EventCreditRefunded || evs[1].ID == evs[0].ID || EventsOf(m)[1].ID != evs[1].ID {
		t.Fatalf("events %+v", evs)
	}
	var env struct {
		Data RefundedData ` + "`json:\"data\"`" + `
	}
	if err := json.Unmarshal(evs[1].Payload, &env); err != nil || env.Data.Credits != 500 {
		t.Fatalf("payload %s: %v", evs[1].Payload, err)
	}
	raw, err := os.ReadFile("../api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Webhooks map[string]json.RawMessage ` + "`json:\"webhooks\"`" + `
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc.Webhooks[string(EventCreditRefunded)] == nil {
		t.Fatalf("api/openapi.json has no webhook %s (%v)", EventCreditRefunded, err)
	}
}
`,
		},
		vet:      []string{"./engine", "./persist"},
		run:      "TestChangelistProbe|TestEventsOf|TestEventPayloads|TestEventSlotNamesAreDistinct|" + driftTests,
		testPkgs: []string{"./engine", "./internal/apidoc", "./client/internal/gen"},
		checks:   drift(),
	}
}

func endpointChange() change {
	return change{
		heading: "Adding an endpoint",
		steps: append([]step{
			{"api/server.go", func(s *scratch) error {
				return s.edit("api/server.go", after("\ts.handle(\"GET\", \"/v1/customers/{id}/credits/history\", optTenant, s.history(lenient))",
					"\n\ts.handle(\"GET\", \"/v1/customers/{id}/credits/summary\", optTenant, s.creditSummary(lenient))"))
			}},
			{"api/credits.go", func(s *scratch) error {
				return s.appendTo("api/credits.go", `
// creditSummary answers GET /v1/customers/{id}/credits/summary.
func (s *Server) creditSummary(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		sum, err := s.credits.Summary(c.reqContext(), c.scope, r)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, sum)
	}
}
`)
			}},
			{"api/credits_test.go", func(s *scratch) error {
				return s.appendTo("api/credits_test.go", `
func TestCreditSummaryRoute(t *testing.T) {
	h := setup(t)
	if r := h.do("GET", "/v1/customers/nobody/credits/summary", "", h.key()...); r.status != 404 {
		t.Fatalf("unknown customer: %d %s", r.status, r.body)
	}
}
`)
			}},
			{"engine/credits.go", func(s *scratch) error {
				return s.appendTo("engine/credits.go", `
// CreditSummary is a customer's balance and count of live blocks.
type CreditSummary struct {
	Balance int64 `+"`json:\"balance\"`"+`
	Blocks  int   `+"`json:\"blocks\"`"+`
}

// Summary is the customer's CreditSummary.
func (s *Credits) Summary(ctx context.Context, scope Scope, ref CustomerRef) (CreditSummary, error) {
	a, err := s.Account(ctx, scope, ref, true)
	if err != nil {
		return CreditSummary{}, err
	}
	return CreditSummary{Balance: a.Balance, Blocks: len(a.Blocks)}, nil
}
`)
			}},
			{"api/openapi.json", func(s *scratch) error {
				return s.openapi(func(doc *jnode) error {
					paths := doc.at("paths")
					src := paths.at("/v1/customers/{id}/overage")
					if src == nil {
						return fmt.Errorf("no path /v1/customers/{id}/overage to model the new one on")
					}
					item := mustJSON(string(src.encode()))
					get := item.at("get")
					get.set("operationId", mustJSON(`"creditSummary"`), "")
					get.set("summary", mustJSON(`"Balance and live blocks"`), "")
					get.set("parameters", mustJSON(`[{"$ref": "#/components/parameters/CustomerId"}]`), "")
					media := get.at("responses", "200", "content", "application/json")
					get.at("responses", "200").set("description", mustJSON(`"The summary."`), "")
					media.set("schema", mustJSON(`{"$ref": "#/components/schemas/CreditSummary"}`), "")
					media.set("example", mustJSON(`{"balance": 1500, "blocks": 2}`), "")
					paths.set("/v1/customers/{id}/credits/summary", item, "/v1/customers/{id}/credits/history")
					doc.at("components", "schemas").set("CreditSummary", mustJSON(`{"type": "object", "description": "A customer's balance and live blocks.",
						"properties": {"balance": {"type": "integer", "format": "int64"}, "blocks": {"type": "integer"}},
						"required": ["balance", "blocks"]}`), "")
					return nil
				})
			}},
		}, append(regenerate(),
			step{"client/live_test.go", func(s *scratch) error {
				return s.edit("client/live_test.go", after("\t\tmust(t, err, \"Overage\")",
					"\n\t\tif _, err := c.CreditSummary(ctx, \"ada\"); err != nil {\n\t\t\tt.Fatalf(\"CreditSummary: %v\", err)\n\t\t}"))
			}},
			step{"internal/e2e/openapi_responses_test.go", func(s *scratch) error {
				return s.edit("internal/e2e/openapi_responses_test.go", after("\tw.want(200, \"GET\", \"/v1/customers/\"+w.customer+\"/overage?from=\"+from+\"&to=\"+to, nil)",
					"\n\tw.want(200, \"GET\", \"/v1/customers/\"+w.customer+\"/credits/summary\", nil)"))
			}},
		)...),
		probes: map[string]string{
			"api/zz_changelist_probe_test.go": `package api

import "testing"

// The route answers a known customer.
func TestChangelistProbe(t *testing.T) {
	h := setup(t)
	if r := h.do("POST", "/v1/customers", ` + "`" + `{"external_id":"ada"}` + "`" + `, h.idemKey("c1")...); r.status != 201 {
		t.Fatalf("create customer: %d %s", r.status, r.body)
	}
	r := h.do("GET", "/v1/customers/ada/credits/summary", "", h.key()...)
	if r.status != 200 || r.json()["balance"] != float64(0) {
		t.Fatalf("summary: %d %s", r.status, r.body)
	}
}
`,
		},
		// go test compiles and vets client and internal/e2e; a separate
		// go vet of them doubled the run on a loaded two-core machine.
		vet:      []string{"./engine", "./api"},
		run:      "TestChangelistProbe|TestCreditSummaryRoute|TestOpenAPIMatchesRoutes|TestAgainstCreditd|TestOpenAPIResponses|" + driftTests,
		testPkgs: []string{"./api", "./client", "./internal/e2e", "./internal/apidoc", "./client/internal/gen"},
		checks:   drift(),
	}
}
