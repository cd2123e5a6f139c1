package openfeature

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	of "github.com/open-feature/go-sdk/openfeature"
	"github.com/open-feature/go-sdk/openfeature/isolated"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/client/edge"
)

func ptr[T any](v T) *T { return &v }

// checker is a Checker whose answers are fixed per metric; it keeps the
// customer and units it was last asked about.
type checker struct {
	answers  map[string]edge.Answer
	errs     map[string]error
	customer string
	units    int64
}

func (c *checker) Check(_ context.Context, customer, metric string, units int64) (edge.Answer, error) {
	c.customer, c.units = customer, units
	if err := c.errs[metric]; err != nil {
		return edge.Answer{}, err
	}
	if a, found := c.answers[metric]; found {
		return a, nil
	}
	return edge.Answer{}, &client.Problem{Status: http.StatusNotFound, Detail: "no active metering rule for " + metric}
}

func answer(typ string, allowed bool, src edge.Source, age time.Duration) edge.Answer {
	return edge.Answer{CheckResult: client.CheckResult{Type: typ, CustomerID: "uuid-alice", Allowed: allowed}, Source: src, Age: age}
}

func setup(t *testing.T) (*checker, of.IClient) {
	t.Helper()
	theme := answer("static", true, edge.SourceMemory, 40*time.Millisecond)
	theme.Config = map[string]any{"color": "red", "max_projects": float64(3), "ratio": 0.5, "nested": map[string]any{"a": true}}
	sso := answer("boolean", true, edge.SourceMemory, 40*time.Millisecond)
	sso.Enabled = ptr(true)
	beta := answer("boolean", false, edge.SourceHTTP, 0)
	beta.Enabled = ptr(false)
	api := answer("metered", true, edge.SourceMemory, 40*time.Millisecond)
	api.EffectiveBalance = ptr(int64(990))
	broke := answer("metered", false, edge.SourceMemory, 40*time.Millisecond)
	broke.EffectiveBalance = ptr(int64(0))
	staleOpen := answer("static", true, edge.SourcePolicy, 4*time.Second)
	staleOpen.Config = map[string]any{"color": "red"}
	staleClosed := answer("static", false, edge.SourcePolicy, 4*time.Second)
	staleClosed.Config = map[string]any{"color": "red"}
	c := &checker{answers: map[string]edge.Answer{
		"unasked-open": answer("", true, edge.SourcePolicy, 0), "unasked-closed": answer("", false, edge.SourcePolicy, 0),
		"stale-open": staleOpen, "stale-closed": staleClosed,
		"theme": theme, "sso": sso, "beta": beta, "api": api, "broke": broke,
		"seats":  answer("gauge", true, edge.SourceHTTP, 0),
		"closed": answer("metered", false, edge.SourcePolicy, 4*time.Second),
		"empty":  answer("static", true, edge.SourceMemory, 0),
	}, errs: map[string]error{
		"down":   errors.New("dial tcp: connection refused"),
		"strict": &client.Problem{Status: http.StatusNotFound, Detail: "customer not found"},
		"bad..":  &client.Problem{Status: http.StatusBadRequest, Field: "billable_metric_key", Detail: "billable_metric_key is invalid"},
	}}
	api2 := isolated.NewAPI()
	if err := api2.SetProviderAndWait(context.Background(), New(c)); err != nil {
		t.Fatal(err)
	}
	return c, api2.NewClient()
}

// TestProvider: every flag type through the OpenFeature client, with the
// value, reason, error code and metadata the spec asks for; the targeting
// key is the customer and a check is for one unit.
func TestProvider(t *testing.T) {
	t.Parallel()
	alice := of.NewEvaluationContext("alice", nil)
	anonymous := of.NewTargetlessEvaluationContext(map[string]any{"plan": "pro"})
	type result struct {
		value  any
		reason of.Reason
		code   of.ErrorCode
		source string // "" when the resolution carries no metadata
	}
	cases := []struct {
		name string
		kind string // bool, string, int, float, object
		flag string
		def  any
		ctx  of.EvaluationContext
		want result
	}{
		{"boolean entitlement on, from memory", "bool", "sso", false, alice, result{true, of.CachedReason, "", "memory"}},
		{"boolean entitlement off, over HTTP", "bool", "beta", true, alice, result{false, of.TargetingMatchReason, "", "http"}},
		{"metered allows one unit", "bool", "api", false, alice, result{true, of.CachedReason, "", "memory"}},
		{"metered refuses one unit", "bool", "broke", true, alice, result{false, of.CachedReason, "", "memory"}},
		{"gauge headroom", "bool", "seats", false, alice, result{true, of.TargetingMatchReason, "", "http"}},
		{"fail-closed policy is the configured default", "bool", "closed", true, alice, result{false, of.DefaultReason, "", "policy"}},
		{"fail-open with no figures", "bool", "unasked-open", false, alice, result{true, of.DefaultReason, "", "policy"}},
		{"fail-closed with no figures", "bool", "unasked-closed", true, alice, result{false, of.DefaultReason, "", "policy"}},
		{"config under fail-open, kept from before", "object", "stale-open", nil, alice, result{map[string]any{"color": "red"}, of.DefaultReason, "", "policy"}},
		{"config under fail-closed is the default", "object", "stale-closed", "d", alice, result{"d", of.DefaultReason, "", "policy"}},
		{"config member under fail-closed is the default", "string", "stale-closed/color", "blue", alice, result{"blue", of.DefaultReason, "", "policy"}},
		{"config with no figures is the default", "object", "unasked-open", "d", alice, result{"d", of.DefaultReason, "", "policy"}},
		{"static read as boolean", "bool", "theme", true, alice, result{true, of.ErrorReason, of.TypeMismatchCode, "memory"}},
		{"unknown metric", "bool", "nope", true, alice, result{true, of.ErrorReason, of.FlagNotFoundCode, ""}},
		{"no targeting key", "bool", "sso", true, anonymous, result{true, of.ErrorReason, of.TargetingKeyMissingCode, ""}},
		{"customer unknown under a strict id", "bool", "strict", true, alice, result{true, of.ErrorReason, of.InvalidContextCode, ""}},
		{"malformed metric key", "bool", "bad..", true, alice, result{true, of.ErrorReason, of.FlagNotFoundCode, ""}},
		{"creditd unreachable", "bool", "down", true, alice, result{true, of.ErrorReason, of.GeneralCode, ""}},
		{"static config", "object", "theme", nil, alice, result{map[string]any{"color": "red", "max_projects": float64(3), "ratio": 0.5, "nested": map[string]any{"a": true}}, of.CachedReason, "", "memory"}},
		{"static without config is an empty object", "object", "empty", nil, alice, result{map[string]any{}, of.CachedReason, "", "memory"}},
		{"static config member as object", "object", "theme/nested", nil, alice, result{map[string]any{"a": true}, of.CachedReason, "", "memory"}},
		{"boolean read as object", "object", "sso", "d", alice, result{"d", of.ErrorReason, of.TypeMismatchCode, "memory"}},
		{"string member", "string", "theme/color", "blue", alice, result{"red", of.CachedReason, "", "memory"}},
		{"string flag without a member", "string", "theme", "blue", alice, result{"blue", of.ErrorReason, of.FlagNotFoundCode, ""}},
		{"missing member", "string", "theme/font", "serif", alice, result{"serif", of.ErrorReason, of.FlagNotFoundCode, "memory"}},
		{"number read as string", "string", "theme/max_projects", "x", alice, result{"x", of.ErrorReason, of.TypeMismatchCode, "memory"}},
		{"member of a boolean entitlement", "string", "sso/color", "x", alice, result{"x", of.ErrorReason, of.TypeMismatchCode, "memory"}},
		{"string member without targeting key", "string", "theme/color", "x", anonymous, result{"x", of.ErrorReason, of.TargetingKeyMissingCode, ""}},
		{"integer member", "int", "theme/max_projects", int64(1), alice, result{int64(3), of.CachedReason, "", "memory"}},
		{"fraction read as integer", "int", "theme/ratio", int64(1), alice, result{int64(1), of.ErrorReason, of.TypeMismatchCode, "memory"}},
		{"float member", "float", "theme/ratio", 0.1, alice, result{0.5, of.CachedReason, "", "memory"}},
		{"string read as float", "float", "theme/color", 0.1, alice, result{0.1, of.ErrorReason, of.TypeMismatchCode, "memory"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, oc := setup(t)
			ctx := context.Background()
			var (
				got any
				d   of.EvaluationDetails
			)
			switch tc.kind {
			case "bool":
				r, _ := oc.BooleanValueDetails(ctx, tc.flag, tc.def.(bool), tc.ctx)
				got, d = r.Value, r.EvaluationDetails
			case "string":
				r, _ := oc.StringValueDetails(ctx, tc.flag, tc.def.(string), tc.ctx)
				got, d = r.Value, r.EvaluationDetails
			case "int":
				r, _ := oc.IntValueDetails(ctx, tc.flag, tc.def.(int64), tc.ctx)
				got, d = r.Value, r.EvaluationDetails
			case "float":
				r, _ := oc.FloatValueDetails(ctx, tc.flag, tc.def.(float64), tc.ctx)
				got, d = r.Value, r.EvaluationDetails
			case "object":
				r, _ := oc.ObjectValueDetails(ctx, tc.flag, tc.def, tc.ctx)
				got, d = r.Value, r.EvaluationDetails
			}
			if !reflect.DeepEqual(got, tc.want.value) {
				t.Errorf("value %#v, want %#v", got, tc.want.value)
			}
			if d.Reason != tc.want.reason || d.ErrorCode != tc.want.code {
				t.Errorf("reason %s code %q (%s), want %s %q", d.Reason, d.ErrorCode, d.ErrorMessage, tc.want.reason, tc.want.code)
			}
			src, err := d.FlagMetadata.GetString(MetadataSource)
			if tc.want.source == "" {
				if err == nil {
					t.Errorf("metadata source %q on a resolution that reached no answer", src)
				}
				return
			}
			if src != tc.want.source {
				t.Errorf("metadata source %q (%v), want %q", src, err, tc.want.source)
			}
			if _, err := d.FlagMetadata.GetInt(MetadataAgeMS); err != nil {
				t.Errorf("metadata age: %v", err)
			}
			if id, _ := d.FlagMetadata.GetString(MetadataCustomerID); id != "uuid-alice" {
				t.Errorf("metadata customer_id %q", id)
			}
			if c.customer != "alice" || c.units != 1 {
				t.Errorf("checked customer %q units %d, want alice 1", c.customer, c.units)
			}
		})
	}
}

// TestProviderMetadata: the age and the metered balance behind a verdict
// reach the caller as numbers.
func TestProviderMetadata(t *testing.T) {
	t.Parallel()
	_, oc := setup(t)
	d, err := oc.BooleanValueDetails(context.Background(), "api", false, of.NewEvaluationContext("alice", nil))
	if err != nil {
		t.Fatal(err)
	}
	age, _ := d.FlagMetadata.GetInt(MetadataAgeMS)
	bal, _ := d.FlagMetadata.GetInt(MetadataEffectiveBalance)
	typ, _ := d.FlagMetadata.GetString(MetadataEntitlementType)
	if age != 40 || bal != 990 || typ != "metered" {
		t.Errorf("age_ms %d effective_balance %d entitlement_type %q, want 40 990 metered", age, bal, typ)
	}
	if name := New(nil).Metadata().Name; name != Name {
		t.Errorf("provider name %q", name)
	}
}
