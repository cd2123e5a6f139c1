package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedUpToDate fails when client/types_gen.go or
// client/operations_gen.go differ from what api/openapi.json gives: the
// client then no longer matches the API it documents.
func TestGeneratedUpToDate(t *testing.T) {
	spec, err := os.ReadFile("../../../api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	files, err := generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("generate wrote %d files, want 2", len(files))
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("../..", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("client/%s is stale: run `go generate ./client`", name)
		}
	}
}

// TestGenerateRefusesWhatItCannotType: a schema shape the generator has no
// Go type for is an error, never a silently wrong type.
func TestGenerateRefusesWhatItCannotType(t *testing.T) {
	for _, tc := range []struct{ name, spec string }{
		{"two non-null types", `{"paths":{"/v1/x":{"get":{"operationId":"x","responses":{"200":{"content":{"application/json":{"schema":{"$ref":"#/components/schemas/X"}}}}}}}},
			"components":{"schemas":{"X":{"type":"object","properties":{"a":{"type":["string","integer"]}}}}}}`},
		{"oneOf of two", `{"paths":{"/v1/x":{"get":{"operationId":"x","responses":{"200":{"content":{"application/json":{"schema":{"$ref":"#/components/schemas/X"}}}}}}}},
			"components":{"schemas":{"X":{"type":"object","properties":{"a":{"oneOf":[{"type":"string"},{"type":"integer"}]}}}}}}`},
		{"undefined reference", `{"paths":{"/v1/x":{"get":{"operationId":"x","responses":{"200":{"content":{"application/json":{"schema":{"$ref":"#/components/schemas/Y"}}}}}}}},"components":{"schemas":{}}}`},
		{"no operationId", `{"paths":{"/v1/x":{"get":{"responses":{"204":{}}}}},"components":{"schemas":{}}}`},
		{"undeclared path parameter", `{"paths":{"/v1/x/{id}":{"get":{"operationId":"x","responses":{"204":{}}}}},"components":{"schemas":{}}}`},
	} {
		if _, err := generate([]byte(tc.spec)); err == nil {
			t.Errorf("%s: generate succeeded", tc.name)
		}
	}
}

// TestNames pins how document names become Go names.
func TestNames(t *testing.T) {
	for _, tc := range []struct {
		fn       func(string) string
		in, want string
	}{
		{exported, "low_balance_threshold_mc", "LowBalanceThresholdMC"},
		{exported, "external_id", "ExternalID"},
		{exported, "Cache-Control", "CacheControl"},
		{exported, "webhook_url", "WebhookURL"},
		{unexported, "external_id", "externalID"},
		{unexported, "id", "id"},
		{unexported, "billable_metric_key", "billableMetricKey"},
		{singular, "entries", "entry"},
		{singular, "credits", "credit"},
		{singular, "data", "data_item"},
		{methodName, "getCustomerStrict", "GetCustomerByExternalID"},
		{methodName, "checkCustomerEntitlementByExternalId", "CheckCustomerEntitlementByExternalID"},
		{methodName, "consume", "Consume"},
	} {
		if got := tc.fn(tc.in); got != tc.want {
			t.Errorf("%q -> %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestFormMembers: a member that only one of an object's oneOf forms
// requires is a plain value with omitempty (callers of the other form
// leave it out), a member required outright stays a plain value without
// omitempty, and an optional member outside every form stays a pointer; a
// form member whose zero is a value (minimum 0, or none) stays a pointer too,
// so 0 is sent.
func TestFormMembers(t *testing.T) {
	spec := `{"paths":{"/v1/x":{"post":{"operationId":"x","requestBody":{"content":{"application/json":{"schema":{"$ref":"#/components/schemas/X"}}}},
		"responses":{"200":{"description":"ok"}}}}},
		"components":{"schemas":{"X":{"type":"object","properties":{"id":{"type":"string"},"key":{"type":"string"},
			"n":{"type":"integer","format":"int64","minimum":1},"list":{"type":"array","items":{"type":"string"}},"note":{"type":"string"},
			"z":{"type":"integer","format":"int64","minimum":0}},
			"required":["id"],"oneOf":[{"required":["key","n"]},{"required":["list"]},{"required":["z"]}]}}}}`
	files, err := generate([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	types := string(files["types_gen.go"])
	for _, want := range []string{"ID string `json:\"id\"`", "Key string `json:\"key,omitempty\"`", "N int64 `json:\"n,omitempty\"`",
		"List []string `json:\"list,omitempty\"`", "Note *string `json:\"note,omitempty\"`", "Z *int64 `json:\"z,omitempty\"`"} {
		if !bytes.Contains(bytes.Join(bytes.Fields([]byte(types)), []byte(" ")), bytes.Join(bytes.Fields([]byte(want)), []byte(" "))) {
			t.Errorf("types_gen.go lacks %q:\n%s", want, types)
		}
	}
}
