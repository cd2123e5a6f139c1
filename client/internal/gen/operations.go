package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// methods are the HTTP methods an OpenAPI path item may hold, as keys.
var methods = map[string]string{
	"get": "GET", "put": "PUT", "post": "POST", "delete": "DELETE", "patch": "PATCH", "head": "HEAD", "options": "OPTIONS",
}

// idempotencyHeader is the header the client fills itself (WithIdempotencyKey
// or a generated UUID), so it is no parameter of the generated methods.
const idempotencyHeader = "Idempotency-Key"

type param struct {
	name, in, desc string
	required       bool
	schema         *object
}

type operation struct {
	id, goName, method, path, summary, desc string
	pathParams                              []param
	// options are the query and header parameters, members of the
	// operation's Params struct.
	options    []param
	idempotent bool
	bodyType   string
	bodyOpt    bool
	respType   string
	// pageItem is the item type of a cursor-paged answer ("" when the
	// operation does not page).
	pageItem string
}

var pathParamRE = regexp.MustCompile(`\{([^}]+)\}`)

// methodName is the Go method of an operationId: the strict external-id
// twins ("...Strict") are named ...ByExternalID like the others.
func methodName(id string) string {
	name := strings.ToUpper(id[:1]) + id[1:]
	if strings.HasSuffix(name, "Strict") {
		name = strings.TrimSuffix(name, "Strict") + "ByExternalId"
	}
	return strings.ReplaceAll(name, "ExternalId", "ExternalID")
}

// operations collects the tenant operations in document order and marks
// the schemas they reach.
// eventStream reports an operation whose success is a text/event-stream.
func eventStream(o *object) bool {
	rs := o.obj("responses")
	if rs == nil {
		return false
	}
	for _, code := range rs.keys {
		if strings.HasPrefix(code, "2") && rs.obj(code).obj("content").obj("text/event-stream") != nil {
			return true
		}
	}
	return false
}

func (g *generator) operations() ([]*operation, error) {
	paths := g.root.obj("paths")
	var ops []*operation
	seen := map[string]bool{}
	for _, p := range paths.keys {
		if !strings.HasPrefix(p, tenantPrefix) {
			continue
		}
		item := paths.obj(p)
		shared, err := g.parameters(item.list("parameters"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, m := range item.keys {
			method, ok := methods[m]
			if !ok {
				continue
			}
			o := item.obj(m)
			if eventStream(o) {
				// An answer that never ends is read by hand (client/stream.go),
				// not by the generated request and decode.
				continue
			}
			op := &operation{id: o.str("operationId"), method: method, path: p, summary: o.str("summary"), desc: o.str("description")}
			if op.id == "" {
				return nil, fmt.Errorf("%s %s has no operationId", method, p)
			}
			op.goName = methodName(op.id)
			if seen[op.goName] {
				return nil, fmt.Errorf("two operations are named %s", op.goName)
			}
			seen[op.goName] = true
			own, err := g.parameters(o.list("parameters"))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op.id, err)
			}
			if err := g.sortParams(op, append(append([]param(nil), shared...), own...)); err != nil {
				return nil, fmt.Errorf("%s: %w", op.id, err)
			}
			if err := g.body(op, o.obj("requestBody")); err != nil {
				return nil, fmt.Errorf("%s: %w", op.id, err)
			}
			if err := g.response(op, o.obj("responses")); err != nil {
				return nil, fmt.Errorf("%s: %w", op.id, err)
			}
			ops = append(ops, op)
		}
	}
	return ops, nil
}

// parameters resolves a parameter list's references.
func (g *generator) parameters(list []any) ([]param, error) {
	var out []param
	for _, x := range list {
		po, _ := x.(*object)
		if ref := po.str("$ref"); ref != "" {
			const pre = "#/components/parameters/"
			if !strings.HasPrefix(ref, pre) || g.params.obj(strings.TrimPrefix(ref, pre)) == nil {
				return nil, fmt.Errorf("unresolved parameter %q", ref)
			}
			po = g.params.obj(strings.TrimPrefix(ref, pre))
		}
		req, _ := po.get("required").(bool)
		out = append(out, param{name: po.str("name"), in: po.str("in"), desc: po.str("description"), required: req, schema: po.obj("schema")})
	}
	return out, nil
}

// sortParams files an operation's parameters: path ones in template
// order, the Idempotency-Key as a flag, the rest as options.
func (g *generator) sortParams(op *operation, ps []param) error {
	byName := map[string]param{}
	for _, p := range ps {
		switch {
		case p.in == "path":
			byName[p.name] = p
		case p.in == "header" && p.name == idempotencyHeader:
			op.idempotent = true
		case p.in == "query" || p.in == "header":
			op.options = append(op.options, p)
		default:
			return fmt.Errorf("parameter %s in %s is not supported", p.name, p.in)
		}
	}
	for _, m := range pathParamRE.FindAllStringSubmatch(op.path, -1) {
		p, ok := byName[m[1]]
		if !ok {
			return fmt.Errorf("path parameter %s is not declared", m[1])
		}
		op.pathParams = append(op.pathParams, p)
	}
	if len(op.pathParams) != len(byName) {
		return fmt.Errorf("a declared path parameter is not in the path")
	}
	return nil
}

// body records the request body's schema.
func (g *generator) body(op *operation, rb *object) error {
	if rb == nil {
		return nil
	}
	s := rb.obj("content").obj("application/json").obj("schema")
	if s == nil {
		return fmt.Errorf("request body without an application/json schema")
	}
	n, err := refName(s.str("$ref"))
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	req, _ := rb.get("required").(bool)
	op.bodyType, op.bodyOpt = n, !req
	return g.reach(n, true)
}

// response records the first 2xx answer's schema (none for a 204).
func (g *generator) response(op *operation, rs *object) error {
	for _, code := range rs.keys {
		st, err := strconv.Atoi(code)
		if err != nil || st < 200 || st > 299 {
			continue
		}
		s := rs.obj(code).obj("content").obj("application/json").obj("schema")
		if s == nil {
			return nil
		}
		n, err := refName(s.str("$ref"))
		if err != nil {
			return fmt.Errorf("response %d: %w", st, err)
		}
		op.respType = n
		if err := g.reach(n, false); err != nil {
			return err
		}
		op.pageItem = g.pageItem(op, n)
		return nil
	}
	return fmt.Errorf("no 2xx response")
}

// pageItem is the item type of a response schema that pages ({data:
// [$ref], pagination}) for an operation that takes a cursor; "" otherwise.
func (g *generator) pageItem(op *operation, schema string) string {
	cursor := false
	for _, p := range op.options {
		cursor = cursor || p.in == "query" && p.name == "cursor"
	}
	props := g.schemas.obj(schema).obj("properties")
	if !cursor || op.paramsRequired() || op.bodyType != "" || props.obj("pagination") == nil {
		return ""
	}
	n, err := refName(props.obj("data").obj("items").str("$ref"))
	if err != nil {
		return ""
	}
	return n
}

// paramsType is the options struct of an operation ("" when none).
func (op *operation) paramsType() string {
	if len(op.options) == 0 {
		return ""
	}
	return op.goName + "Params"
}

// paramsRequired reports whether an option is required: the struct is then
// passed by value.
func (op *operation) paramsRequired() bool {
	for _, p := range op.options {
		if p.required {
			return true
		}
	}
	return false
}

// operationsSource writes the Params structs and one method per operation.
func (g *generator) operationsSource(ops []*operation) string {
	g.file = "operations"
	g.imports["operations"]["net/url"] = false
	var b strings.Builder
	for _, op := range ops {
		g.writeParams(&b, op)
		g.writeMethod(&b, op)
	}
	for p, used := range g.imports["operations"] {
		if !used {
			delete(g.imports["operations"], p)
		}
	}
	return b.String()
}

// writeParams declares an operation's Params struct and its encoder.
func (g *generator) writeParams(b *strings.Builder, op *operation) {
	name := op.paramsType()
	if name == "" {
		return
	}
	d := &structDecl{name: name, doc: name + " are the query and header parameters of " + op.goName + "."}
	var enc strings.Builder
	for _, p := range op.options {
		typ, _, _, err := g.baseType(name, p.name, p.schema, false)
		if err != nil { // scalar schemas only; checked by the test of the generator
			panic(fmt.Sprintf("%s parameter %s: %v", op.id, p.name, err))
		}
		field := exported(p.name)
		doc := memberDoc(p.schema)
		where := "Query parameter " + p.name + "."
		if p.in == "header" {
			where = "Header " + p.name + "."
		}
		if p.desc != "" {
			doc = sentence(p.desc) + " " + doc
		}
		doc = strings.TrimSpace(where + " " + doc)
		set := "r.query"
		if p.in == "header" {
			set = "r.header"
		}
		if p.required {
			doc += " Required."
			d.fields = append(d.fields, fieldDecl{name: field, typ: typ, tag: "", doc: doc})
			fmt.Fprintf(&enc, "\t%s(%q, p.%s)\n", set, p.name, field)
			continue
		}
		d.fields = append(d.fields, fieldDecl{name: field, typ: "*" + typ, tag: "", doc: doc})
		fmt.Fprintf(&enc, "\tif p.%s != nil {\n\t\t%s(%q, *p.%s)\n\t}\n", field, set, p.name, field)
	}
	writeStruct(b, d)
	fmt.Fprintf(b, "// encode adds the parameters that are set to r.\nfunc (p *%s) encode(r *request) {\n\tif p == nil {\n\t\treturn\n\t}\n%s}\n\n", name, enc.String())
}

// writeMethod writes one operation's Client method.
func (g *generator) writeMethod(b *strings.Builder, op *operation) {
	doc := fmt.Sprintf("%s is %s %s (operation %s).", op.goName, op.method, op.path, op.id)
	if op.summary != "" {
		doc += " " + sentence(op.summary)
	}
	if op.desc != "" {
		doc += " " + sentence(op.desc)
	}
	if op.idempotent {
		doc += " It sends an Idempotency-Key: WithIdempotencyKey's, else a new UUID, the same on every retry of the call."
	}
	args := []string{"ctx context.Context"}
	var path strings.Builder
	rest := op.path
	for _, p := range op.pathParams {
		arg := unexported(p.name)
		args = append(args, arg+" string")
		i := strings.Index(rest, "{"+p.name+"}")
		fmt.Fprintf(&path, "%q + url.PathEscape(%s) + ", rest[:i], arg)
		rest = rest[i+len(p.name)+2:]
		g.imports["operations"]["net/url"] = true
	}
	fmt.Fprintf(&path, "%q", rest)
	pathExpr := strings.ReplaceAll(path.String(), ` + ""`, "")
	pathExpr = strings.TrimPrefix(pathExpr, `"" + `)
	if op.bodyType != "" {
		if op.bodyOpt {
			args = append(args, "body *"+op.bodyType)
		} else {
			args = append(args, "body "+op.bodyType)
		}
	}
	if pt := op.paramsType(); pt != "" {
		if op.paramsRequired() {
			args = append(args, "params "+pt)
		} else {
			args = append(args, "params *"+pt)
		}
	}
	args = append(args, "opts ...CallOption")
	ret := "error"
	if op.respType != "" {
		ret = "(*" + op.respType + ", error)"
	}
	fmt.Fprintf(b, "%s\nfunc (c *Client) %s(%s) %s {\n", comment(doc, ""), op.goName, strings.Join(args, ", "), ret)
	fmt.Fprintf(b, "\tr := &request{method: %q, path: %s, idempotent: %v}\n", op.method, pathExpr, op.idempotent)
	if op.bodyType != "" {
		if op.bodyOpt {
			b.WriteString("\tif body != nil {\n\t\tr.body = body\n\t}\n")
		} else {
			b.WriteString("\tr.body = body\n")
		}
	}
	if op.paramsType() != "" {
		b.WriteString("\tparams.encode(r)\n")
	}
	if op.respType == "" {
		b.WriteString("\treturn c.do(ctx, r, opts)\n}\n\n")
		return
	}
	fmt.Fprintf(b, "\tout := new(%s)\n\tr.out = out\n\tif err := c.do(ctx, r, opts); err != nil {\n\t\treturn nil, err\n\t}\n\treturn out, nil\n}\n\n", op.respType)
	if op.pageItem != "" {
		g.writeAll(b, op, args)
	}
}

// writeAll writes the iterator over every item of a paged operation.
func (g *generator) writeAll(b *strings.Builder, op *operation, args []string) {
	g.imports["operations"]["iter"] = true
	var call []string
	for _, a := range args[1 : len(args)-2] { // path arguments
		call = append(call, strings.Fields(a)[0])
	}
	doc := fmt.Sprintf("%sAll iterates over every item %s answers, page after page from params.Cursor (the first page when nil), "+
		"until the last page or the first error, which it yields once. Stop early by breaking out of the loop.", op.goName, op.goName)
	fmt.Fprintf(b, "%s\nfunc (c *Client) %sAll(%s) iter.Seq2[%s, error] {\n", comment(doc, ""), op.goName, strings.Join(args, ", "), op.pageItem)
	fmt.Fprintf(b, "\treturn func(yield func(%s, error) bool) {\n\t\tvar p %s\n\t\tif params != nil {\n\t\t\tp = *params\n\t\t}\n", op.pageItem, op.paramsType())
	fmt.Fprintf(b, "\t\tfor {\n\t\t\tpage, err := c.%s(%s)\n", op.goName, strings.Join(append(append([]string{"ctx"}, call...), "&p", "opts..."), ", "))
	fmt.Fprintf(b, "\t\t\tif err != nil {\n\t\t\t\tyield(%s{}, err)\n\t\t\t\treturn\n\t\t\t}\n", op.pageItem)
	b.WriteString("\t\t\tfor _, item := range page.Data {\n\t\t\t\tif !yield(item, nil) {\n\t\t\t\t\treturn\n\t\t\t\t}\n\t\t\t}\n")
	b.WriteString("\t\t\tif !page.Pagination.HasMore || page.Pagination.NextCursor == nil {\n\t\t\t\treturn\n\t\t\t}\n")
	b.WriteString("\t\t\tp.Cursor = page.Pagination.NextCursor\n\t\t}\n\t}\n}\n\n")
}
