package e2e

import (
	"context"
	"reflect"
	"testing"
	"time"

	of "github.com/open-feature/go-sdk/openfeature"
	"github.com/open-feature/go-sdk/openfeature/isolated"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/client/edge"
	edgeof "github.com/creditd/creditd/client/edge/openfeature"
)

// TestOpenFeatureProvider (issue 27 item 4): feature-flag code reading a
// running creditd through the OpenFeature client and the edge provider
// gets a boolean entitlement, a static entitlement's config and one of its
// members from memory, an unknown metric as FLAG_NOT_FOUND, and sees a
// variant entitlement made over HTTP reach it without restarting anything.
func TestOpenFeatureProvider(t *testing.T) {
	t.Parallel()
	s := NewStack(t, SingleNode())
	tn := s.NewTenant(uniq("openfeature"))
	a := s.as(t, tn.Live)
	sso, limits := uniq("sso"), uniq("limits")
	a.newMetric(sso, "boolean", map[string]any{"enabled": false})
	a.newMetric(limits, "static", map[string]any{"config": map[string]any{"tier": "free", "max_projects": 3}})
	plan := a.newPlan(map[string]any{"name": "Pro"})
	variant := a.newVariant(plan["id"].(string), map[string]any{"billing_cycle": "monthly"})
	cust, _ := a.newCustomer()
	a.newSubscription(cust, plan, variant)

	e := edge.New(client.New(s.URL, tn.Live), edge.Config{MaxAge: 5 * time.Second})
	e.Start(context.Background())
	t.Cleanup(e.Close)
	deadline := time.Now().Add(10 * time.Second)
	for !e.StreamUp() {
		if time.Now().After(deadline) {
			t.Fatal("the evaluator's stream did not open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	api := isolated.NewAPI()
	if err := api.SetProviderAndWait(context.Background(), edgeof.New(e)); err != nil {
		t.Fatal(err)
	}
	flags := api.NewClient()
	ctx, who := context.Background(), of.NewEvaluationContext(cust, nil)

	// The first read fetches the snapshot; the second is from memory.
	if on, err := flags.BooleanValue(ctx, sso, true, who); err != nil || on {
		t.Fatalf("sso before the plan grants it: %v, %v", on, err)
	}
	d, err := flags.BooleanValueDetails(ctx, sso, true, who)
	if src, _ := d.FlagMetadata.GetString(edgeof.MetadataSource); err != nil || d.Value || d.Reason != of.CachedReason || src != "memory" {
		t.Fatalf("second read: %+v, %v", d, err)
	}
	cfg, err := flags.ObjectValue(ctx, limits, nil, who)
	if want := map[string]any{"tier": "free", "max_projects": float64(3)}; err != nil || !reflect.DeepEqual(cfg, want) {
		t.Errorf("static config %#v, %v; want %#v", cfg, err, want)
	}
	if tier, err := flags.StringValue(ctx, limits+"/tier", "none", who); err != nil || tier != "free" {
		t.Errorf("static member tier %q, %v", tier, err)
	}
	if n, err := flags.IntValue(ctx, limits+"/max_projects", 0, who); err != nil || n != 3 {
		t.Errorf("static member max_projects %d, %v", n, err)
	}
	if d, _ := flags.BooleanValueDetails(ctx, uniq("nope"), true, who); d.ErrorCode != of.FlagNotFoundCode || !d.Value {
		t.Errorf("unknown metric: code %q value %v, want FLAG_NOT_FOUND and the default", d.ErrorCode, d.Value)
	}
	if d, _ := flags.BooleanValueDetails(ctx, sso, true, of.NewTargetlessEvaluationContext(nil)); d.ErrorCode != of.TargetingKeyMissingCode {
		t.Errorf("no targeting key: code %q", d.ErrorCode)
	}

	base := "/v1/plans/" + plan["id"].(string) + "/variants/" + variant["id"].(string) + "/entitlements"
	wantStatus(t, a.post(base, map[string]any{"billable_metric_key": sso, "value": map[string]any{"enabled": true}}), 201, "variant entitlement")
	wantStatus(t, a.post(base, map[string]any{"billable_metric_key": limits,
		"value": map[string]any{"config": map[string]any{"tier": "pro", "max_projects": 50}}}), 201, "variant static entitlement")
	start := time.Now()
	for {
		on, _ := flags.BooleanValueDetails(ctx, sso, false, who)
		tier, _ := flags.StringValueDetails(ctx, limits+"/tier", "none", who)
		if on.Value && tier.Value == "pro" && on.Reason == of.CachedReason && tier.Reason == of.CachedReason {
			t.Logf("the variant entitlements reached the flags in %v", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the variant entitlements did not reach the flags in 10 s: sso %+v, tier %+v", on, tier)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, _ := flags.IntValue(ctx, limits+"/max_projects", 0, who); n != 50 {
		t.Errorf("max_projects after the variant entitlement %d, want 50", n)
	}
}
