package persist

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// This file reads the SQL of persist's Go source for the distributed-
// Postgres readiness test (readiness_test.go, issue 30 item 2).

// sqlStatement is one SQL statement found in persist's Go source: the text
// with non-constant parts replaced by "?", where it is, and the function or
// package-level declaration it belongs to.
type sqlStatement struct {
	file, owner string
	line        int
	text        string
}

// sqlVerb matches the start of a statement (comments and space skipped).
var sqlVerb = regexp.MustCompile(`(?is)^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b`)

// persistStatements parses persist/*.go (tests excluded) and returns every
// string expression that reads as a SQL statement. Concatenations of
// literals and package-level string constants are folded; a non-constant
// operand (a Go variable spliced in) becomes "?".
func persistStatements(t *testing.T) []sqlStatement {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
	}
	// Package-level constants, folded until nothing changes (a constant
	// may be built of constants declared later).
	consts := map[string]string{}
	for changed := true; changed; {
		changed = false
		for _, af := range parsed {
			for _, d := range af.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, s := range gd.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i >= len(vs.Values) {
							continue
						}
						if _, done := consts[n.Name]; done {
							continue
						}
						if v, ok := foldConst(vs.Values[i], consts); ok {
							consts[n.Name] = v
							changed = true
						}
					}
				}
			}
		}
	}
	var out []sqlStatement
	for _, af := range parsed {
		file := fset.Position(af.Pos()).Filename
		for _, d := range af.Decls {
			owner := declName(d)
			ast.Inspect(d, func(n ast.Node) bool {
				e, ok := n.(ast.Expr)
				if !ok || !isStringExpr(e) {
					return true
				}
				text := foldLoose(e, consts)
				if sqlVerb.MatchString(text) {
					out = append(out, sqlStatement{file: file, owner: owner, line: fset.Position(e.Pos()).Line, text: text})
				}
				return false // a concatenation is one statement, not its parts
			})
		}
	}
	return out
}

func declName(d ast.Decl) string {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv != nil && len(d.Recv.List) == 1 {
			t := d.Recv.List[0].Type
			if s, ok := t.(*ast.StarExpr); ok {
				t = s.X
			}
			if id, ok := t.(*ast.Ident); ok {
				return id.Name + "." + d.Name.Name
			}
		}
		return d.Name.Name
	case *ast.GenDecl:
		for _, s := range d.Specs {
			if vs, ok := s.(*ast.ValueSpec); ok && len(vs.Names) > 0 {
				return vs.Names[0].Name
			}
		}
	}
	return "?"
}

// isStringExpr reports whether e is a string literal or a + chain with one.
func isStringExpr(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (isStringExpr(e.X) || isStringExpr(e.Y))
	case *ast.ParenExpr:
		return isStringExpr(e.X)
	}
	return false
}

func foldConst(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[e.Name]
		return s, ok
	case *ast.ParenExpr:
		return foldConst(e.X, consts)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok := foldConst(e.X, consts)
		if !ok {
			return "", false
		}
		y, ok := foldConst(e.Y, consts)
		return x + y, ok
	}
	return "", false
}

func foldLoose(e ast.Expr, consts map[string]string) string {
	if s, ok := foldConst(e, consts); ok {
		return s
	}
	if b, ok := e.(*ast.BinaryExpr); ok && b.Op == token.ADD {
		return foldLoose(b.X, consts) + foldLoose(b.Y, consts)
	}
	if p, ok := e.(*ast.ParenExpr); ok {
		return foldLoose(p.X, consts)
	}
	return " ? "
}

// tableRef finds the tables a statement names (unnest and other set
// functions match too; only tenant tables count).
var tableRef = regexp.MustCompile(`(?i)\b(?:FROM|JOIN|INTO|UPDATE|USING)\s+([a-z_][a-z0-9_]*)`)

var (
	wherePart  = regexp.MustCompile(`(?is)\b(WHERE|ON|USING)\b(.*)`)
	insertHead = regexp.MustCompile(`(?is)^\s*INSERT\b`)
)

// filtersTenant reports whether text states tenant_id: in the column list of
// an INSERT (the row carries its tenant, which routes it), or after a WHERE,
// ON or USING (a predicate or a join condition) otherwise. It reads text,
// not a parse tree: a statement that names tenant_id in a predicate passes
// even if another of its tables is not filtered, which the allow-lists'
// review and the code review catch.
func filtersTenant(text string) bool {
	if insertHead.MatchString(text) {
		head, _, _ := strings.Cut(strings.ToUpper(text), "VALUES")
		head, _, _ = strings.Cut(head, "SELECT")
		return strings.Contains(head, "TENANT_ID")
	}
	m := wherePart.FindStringSubmatch(text)
	return m != nil && strings.Contains(m[2], "tenant_id")
}
