package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/creditd/creditd/api"
)

// TestReferenceUpToDate: docs/api.md is exactly what the generator renders
// from api/openapi.json, so the reference never drifts from the document
// creditd serves.
func TestReferenceUpToDate(t *testing.T) {
	want, err := render(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatalf("%v (run `go run ./internal/apidoc` at the repository root)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/api.md differs from api/openapi.json: run `go run ./internal/apidoc` at the repository root and commit the result")
	}
}

// TestRenderCoversTheDocument: every operation, webhook event and schema of
// the document has its heading in the reference, and every schema link has
// a heading to land on.
func TestRenderCoversTheDocument(t *testing.T) {
	doc := api.OpenAPI()
	md, err := render(doc)
	if err != nil {
		t.Fatal(err)
	}
	root, err := parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(md)
	var want []string
	for _, path := range root.get("paths").keys {
		for _, m := range methods {
			if root.get("paths", path, m) != nil {
				want = append(want, "### `"+strings.ToUpper(m)+" "+path+"`\n")
			}
		}
	}
	for _, name := range root.get("webhooks").keys {
		want = append(want, "### "+name+"\n")
	}
	for _, name := range root.get("components", "schemas").keys {
		want = append(want, "### Schema: "+name+"\n")
		if !strings.Contains(text, "(#schema-"+anchor(name)+")") {
			t.Errorf("schema %s is linked from nowhere in the reference", name)
		}
	}
	for _, h := range want {
		if !strings.Contains(text, h) {
			t.Errorf("reference has no heading %q", strings.TrimSpace(h))
		}
	}
}

// TestTyp: the few words a schema renders as.
func TestTyp(t *testing.T) {
	r := &renderer{}
	cases := []struct{ schema, want string }{
		{`{"type":"string","format":"uuid"}`, "string (uuid)"},
		{`{"type":["string","null"],"format":"date-time"}`, "string (date-time) or null"},
		{`{"type":"array","items":{"$ref":"#/components/schemas/Tier"}}`, "array of [Tier](#schema-tier)"},
		{`{"type":"string","enum":["live","sandbox"]}`, "string, one of `live`, `sandbox`"},
		{`{"const":"ping","type":"string"}`, "string, always `ping`"},
		{`{"allOf":[{"$ref":"#/components/schemas/Problem"},{"type":"object"}]}`, "[Problem](#schema-problem) and object"},
		{`{"type":"object","additionalProperties":{"$ref":"#/components/schemas/SnapshotEntry"}}`, "object of [SnapshotEntry](#schema-snapshotentry) by key"},
		{`{"type":"object","additionalProperties":true}`, "object"},
		{`{}`, "any"},
	}
	for _, tc := range cases {
		n, err := parse([]byte(tc.schema))
		if err != nil {
			t.Fatal(err)
		}
		if got := r.typ(n); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.schema, got, tc.want)
		}
	}
}

// TestEveryBodyHasAnExample: every request body, response body and webhook
// payload of api/openapi.json carries an example (Redocly checks each
// against its schema), so an operation added without one fails here.
func TestEveryBodyHasAnExample(t *testing.T) {
	root, err := parse(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	r := &renderer{root: root}
	check := func(where string, content *node) {
		if content == nil {
			return
		}
		for _, ct := range content.keys {
			if mt := content.fields[ct]; mt.get("example") == nil && mt.get("examples") == nil {
				t.Errorf("%s (%s) has no example", where, ct)
			}
		}
	}
	operation := func(where string, o *node) {
		if rb := o.get("requestBody"); rb != nil {
			check(where+" request body", r.deref(rb).get("content"))
		}
		responses := o.get("responses")
		if responses == nil {
			return
		}
		for _, status := range responses.keys {
			check(where+" "+status, r.deref(responses.fields[status]).get("content"))
		}
	}
	for _, path := range root.get("paths").keys {
		for _, m := range methods {
			if o := root.get("paths", path, m); o != nil {
				operation(strings.ToUpper(m)+" "+path, o)
			}
		}
	}
	hooks := root.get("webhooks")
	if hooks == nil || len(hooks.keys) == 0 {
		t.Fatal("the document has no webhooks")
	}
	for _, name := range hooks.keys {
		post := hooks.fields[name].get("post")
		if post == nil || post.get("requestBody") == nil {
			t.Errorf("webhook %s has no payload", name)
			continue
		}
		operation("webhook "+name, post)
	}
}
