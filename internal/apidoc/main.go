// Command apidoc renders docs/api.md, the API reference, from the OpenAPI
// document creditd serves (api/openapi.json): run `go run ./internal/apidoc`
// from the repository root after changing the document. A test fails while
// docs/api.md differs from what this renders.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/creditd/creditd/api"
)

func main() {
	out := flag.String("o", "docs/api.md", "file to write the reference to")
	flag.Parse()
	md, err := render(api.OpenAPI())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, md, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// methods is the order operations of one path are listed in.
var methods = []string{"get", "post", "put", "patch", "delete"}

// render turns the OpenAPI document into the Markdown reference.
func render(doc []byte) ([]byte, error) {
	root, err := parse(doc)
	if err != nil {
		return nil, err
	}
	r := &renderer{root: root}
	r.header()
	r.auth()
	r.operations()
	r.problems()
	r.webhooks()
	r.schemas()
	return bytes.TrimRight(r.b.Bytes(), "\n"), nil
}

type renderer struct {
	root *node
	b    bytes.Buffer
}

func (r *renderer) p(format string, args ...any) { fmt.Fprintf(&r.b, format, args...) }

// op is one operation with where it lives.
type op struct {
	method, path string
	n            *node
}

// byTag groups the operations under their first tag, in document order.
func (r *renderer) byTag() map[string][]op {
	out := map[string][]op{}
	paths := r.root.get("paths")
	for _, path := range paths.keys {
		item := paths.fields[path]
		for _, m := range methods {
			if o := item.get(m); o != nil {
				tag := "Other"
				if tags := o.get("tags").strs(); len(tags) > 0 {
					tag = tags[0]
				}
				out[tag] = append(out[tag], op{method: strings.ToUpper(m), path: path, n: o})
			}
		}
	}
	return out
}

func (r *renderer) header() {
	info := r.root.get("info")
	r.p("# %s API reference\n\n", info.get("title").str())
	r.p("<!-- Generated from api/openapi.json by `go run ./internal/apidoc`; do not edit by hand. -->\n\n")
	r.p("OpenAPI %s, API version %s. creditd serves the same document at `GET /openapi.json`; this page is rendered from it ", r.root.get("openapi").str(), info.get("version").str())
	r.p("(`go run ./internal/apidoc`), and a test fails while the two differ. The behaviour behind the fields is in [rules.md](rules.md), [invariants.md](invariants.md), [limits.md](limits.md) and [decisions.md](decisions.md).\n\n")
	r.p("%s\n\n", info.get("description").str())
	r.p("## Contents\n\n- [Authentication](#authentication)\n")
	groups := r.byTag()
	for _, t := range r.root.get("tags").items {
		name := t.get("name").str()
		if len(groups[name]) > 0 {
			r.p("- [%s](#%s)\n", name, anchor(name))
		}
	}
	r.p("- [Problems](#problems)\n- [Webhook events](#webhook-events)\n- [Schemas](#schemas)\n\n")
}

func (r *renderer) auth() {
	r.p("## Authentication\n\n")
	schemes := r.root.get("components", "securitySchemes")
	for _, name := range schemes.keys {
		s := schemes.fields[name]
		switch s.get("type").str() {
		case "apiKey":
			r.p("- `%s`: the `%s` %s.", name, s.get("name").str(), s.get("in").str())
		case "http":
			r.p("- `%s`: HTTP `%s` authentication.", name, s.get("scheme").str())
		default:
			r.p("- `%s`: %s.", name, s.get("type").str())
		}
		if d := s.get("description").str(); d != "" {
			r.p(" %s", d)
		}
		r.p("\n")
	}
	r.p("\nAn operation lists the scheme it needs; `none` means no credentials.\n\n")
}

func (r *renderer) operations() {
	groups := r.byTag()
	for _, t := range r.root.get("tags").items {
		name := t.get("name").str()
		ops := groups[name]
		if len(ops) == 0 {
			continue
		}
		r.p("## %s\n\n", name)
		if d := t.get("description").str(); d != "" {
			r.p("%s\n\n", d)
		}
		for _, o := range ops {
			r.operation(o)
		}
	}
}

func (r *renderer) operation(o op) {
	r.p("### `%s %s`\n\n", o.method, o.path)
	r.p("**%s** (`%s`). Auth: %s.\n\n", o.n.get("summary").str(), o.n.get("operationId").str(), r.security(o.n))
	if d := o.n.get("description").str(); d != "" {
		r.p("%s\n\n", d)
	}
	r.parameters(o.n.get("parameters"))
	if rb := o.n.get("requestBody"); rb != nil {
		r.body("Request body", rb)
	}
	r.p("| Status | Meaning | Body |\n|---|---|---|\n")
	responses := o.n.get("responses")
	var examples []string
	for _, status := range responses.keys {
		resp := r.deref(responses.fields[status])
		ct, mt := firstMedia(resp.get("content"))
		body := "none"
		if mt != nil {
			body = r.typ(mt.get("schema")) + " (`" + ct + "`)"
			if ex := mt.get("example"); ex != nil && strings.HasPrefix(status, "2") {
				examples = append(examples, fmt.Sprintf("Example `%s` answer:\n\n%s", status, codeBlock(ct, ex)))
			}
		}
		r.p("| %s | %s | %s |\n", status, cell(resp.get("description").str()), body)
	}
	r.p("\n")
	for _, ex := range examples {
		r.p("%s\n", ex)
	}
}

// security names the schemes an operation needs, the document's default
// when it lists none.
func (r *renderer) security(o *node) string {
	sec := o.get("security")
	if sec == nil {
		sec = r.root.get("security")
	}
	var names []string
	for _, req := range sec.items {
		names = append(names, req.keys...)
	}
	if len(names) == 0 {
		return "none"
	}
	return "`" + strings.Join(names, "` or `") + "`"
}

func (r *renderer) parameters(ps *node) {
	if ps == nil || len(ps.items) == 0 {
		return
	}
	r.p("| Parameter | In | Type | Required | Description |\n|---|---|---|---|---|\n")
	for _, p := range ps.items {
		p = r.deref(p)
		req := "no"
		if p.get("required").text() == "true" {
			req = "yes"
		}
		r.p("| `%s` | %s | %s | %s | %s |\n", p.get("name").str(), p.get("in").str(), r.typ(p.get("schema")), req, cell(p.get("description").str()))
	}
	r.p("\n")
}

// body renders a request body: its schema and its example.
func (r *renderer) body(title string, rb *node) {
	ct, mt := firstMedia(rb.get("content"))
	if mt == nil {
		return
	}
	req := "optional"
	if rb.get("required").text() == "true" {
		req = "required"
	}
	r.p("%s (`%s`, %s): %s.\n\n", title, ct, req, r.typ(mt.get("schema")))
	if ex := mt.get("example"); ex != nil {
		r.p("%s\n", codeBlock(ct, ex))
	}
}

func (r *renderer) problems() {
	r.p("## Problems\n\n")
	r.p("Every error is an RFC 9457 problem (`application/problem+json`, schema %s). The answers the operations above share:\n\n", r.typ(&node{fields: map[string]*node{"$ref": {scalar: "#/components/schemas/Problem"}}, keys: []string{"$ref"}}))
	responses := r.root.get("components", "responses")
	codes := append([]string(nil), responses.keys...)
	sort.Strings(codes)
	for _, status := range codes {
		resp := responses.fields[status]
		r.p("### %s\n\n%s\n\n", status, resp.get("description").str())
		if h := resp.get("headers"); h != nil && len(h.keys) > 0 {
			r.p("Headers: `%s`.\n\n", strings.Join(h.keys, "`, `"))
		}
		if ct, mt := firstMedia(resp.get("content")); mt != nil && mt.get("example") != nil {
			r.p("%s\n", codeBlock(ct, mt.get("example")))
		}
	}
}

func (r *renderer) webhooks() {
	r.p("## Webhook events\n\n")
	r.p("creditd POSTs each event to the tenant's webhook URL, signed per Standard Webhooks. A receiver answers 2xx within 5 seconds; anything else is a failed attempt, retried as each event below says (GET /v1/webhooks/events shows every attempt). Dedupe on the `webhook-id` header: delivery is at least once.\n\n")
	hooks := r.root.get("webhooks")
	for _, name := range hooks.keys {
		post := hooks.fields[name].get("post")
		if post == nil {
			continue
		}
		r.p("### %s\n\n", name)
		if d := post.get("description").str(); d != "" {
			r.p("%s\n\n", d)
		}
		r.parameters(post.get("parameters"))
		r.body("Body", post.get("requestBody"))
	}
}

func (r *renderer) schemas() {
	r.p("## Schemas\n\n")
	schemas := r.root.get("components", "schemas")
	for _, name := range schemas.keys {
		s := schemas.fields[name]
		r.p("### Schema: %s\n\n", name)
		if d := s.get("description").str(); d != "" {
			r.p("%s\n\n", d)
		}
		parts := []*node{s}
		if all := s.get("allOf"); all != nil {
			var refs []string
			parts = nil
			for _, it := range all.items {
				if it.get("$ref") != nil {
					refs = append(refs, r.typ(it))
				} else {
					parts = append(parts, it)
				}
			}
			if len(refs) > 0 {
				r.p("All the members of %s, and:\n\n", strings.Join(refs, ", "))
			}
		}
		wrote := false
		for _, part := range parts {
			props := part.get("properties")
			if props == nil || len(props.keys) == 0 {
				continue
			}
			required := map[string]bool{}
			for _, k := range part.get("required").strs() {
				required[k] = true
			}
			r.p("| Member | Type | Required | Description |\n|---|---|---|---|\n")
			for _, k := range props.keys {
				prop := props.fields[k]
				req := "no"
				if required[k] {
					req = "yes"
				}
				r.p("| `%s` | %s | %s | %s |\n", k, r.typ(prop), req, cell(prop.get("description").str()))
			}
			r.p("\n")
			wrote = true
		}
		if !wrote && s.get("allOf") == nil {
			r.p("Type: %s.\n\n", r.typ(s))
		}
	}
}

// deref follows a local $ref ("#/components/...").
func (r *renderer) deref(n *node) *node {
	for i := 0; n != nil && n.get("$ref") != nil && i < 8; i++ {
		path := strings.Split(strings.TrimPrefix(n.get("$ref").str(), "#/"), "/")
		n = r.root.get(path...)
	}
	return n
}

// typ renders a schema in a few words, linking named schemas.
func (r *renderer) typ(s *node) string {
	if s == nil {
		return "any"
	}
	if ref := s.get("$ref").str(); ref != "" {
		name := ref[strings.LastIndex(ref, "/")+1:]
		return fmt.Sprintf("[%s](#schema-%s)", name, anchor(name))
	}
	for _, k := range []string{"allOf", "oneOf", "anyOf"} {
		if list := s.get(k); list != nil {
			var parts []string
			for _, it := range list.items {
				parts = append(parts, r.typ(it))
			}
			word := map[string]string{"allOf": " and ", "oneOf": " or ", "anyOf": " or "}[k]
			return strings.Join(parts, word)
		}
	}
	var kinds []string
	if t := s.get("type"); t != nil {
		if t.isArr {
			kinds = t.strs()
		} else {
			kinds = []string{t.str()}
		}
	}
	for i, k := range kinds {
		switch k {
		case "array":
			kinds[i] = "array of " + r.typ(s.get("items"))
		case "object":
			if ap := s.get("additionalProperties"); ap != nil && ap.fields != nil && len(ap.keys) > 0 {
				kinds[i] = "object of " + r.typ(ap) + " by key"
			}
		case "integer", "string", "number":
			if f := s.get("format").str(); f != "" {
				kinds[i] = k + " (" + f + ")"
			}
		}
	}
	out := strings.Join(kinds, " or ")
	if out == "" {
		out = "any"
	}
	if c := s.get("const"); c != nil {
		out += ", always `" + c.text() + "`"
	}
	if e := s.get("enum"); e != nil {
		out += ", one of `" + strings.Join(e.strs(), "`, `") + "`"
	}
	return out
}

// firstMedia is the first content type of a content map and its media type.
func firstMedia(content *node) (string, *node) {
	if content == nil || len(content.keys) == 0 {
		return "", nil
	}
	return content.keys[0], content.fields[content.keys[0]]
}

// codeBlock fences an example: JSON indented, text as is.
func codeBlock(ct string, ex *node) string {
	if s, ok := ex.scalar.(string); ok && !strings.Contains(ct, "json") {
		return "```text\n" + strings.TrimRight(s, "\n") + "\n```\n"
	}
	return "```json\n" + string(ex.indent("")) + "\n```\n"
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// anchor is the fragment GitHub gives a heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(heading) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteRune(c)
		case c == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
