package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// moneyCalls are the engine entry points the endpoints call that run a Lua
// money script (consume, usage batch, gauge and lease moves, the four
// reservation verbs, grant and adjust). A route whose endpoint reaches one
// of them is a money route.
var moneyCalls = map[string]bool{
	"entitlements.Consume": true, "entitlements.Usage": true, "entitlements.MoveGauge": true,
	"entitlements.RenewLease": true, "entitlements.ReleaseLease": true,
	"reservations.Create": true, "reservations.Commit": true, "reservations.Release": true, "reservations.Extend": true,
	"credits.Grant": true, "credits.Adjust": true,
}

// serverMethods reads the package's non-test files: for each *Server
// method, the <field>.<Method> calls on its receiver and the receiver's own
// methods it calls (closures included).
func serverMethods(t *testing.T) (calls map[string][]string, handles []*ast.CallExpr) {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	calls = map[string][]string{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Body == nil || len(fn.Recv.List[0].Names) == 0 {
				continue
			}
			if star, ok := fn.Recv.List[0].Type.(*ast.StarExpr); !ok || star.X.(*ast.Ident).Name != "Server" {
				continue
			}
			recv := fn.Recv.List[0].Names[0].Name
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch x := sel.X.(type) {
				case *ast.Ident: // s.method(...)
					if x.Name == recv {
						if sel.Sel.Name == "handle" {
							handles = append(handles, call)
						}
						calls[fn.Name.Name] = append(calls[fn.Name.Name], sel.Sel.Name)
					}
				case *ast.SelectorExpr: // s.field.Method(...)
					if id, ok := x.X.(*ast.Ident); ok && id.Name == recv {
						calls[fn.Name.Name] = append(calls[fn.Name.Name], x.Sel.Name+"."+sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	return calls, handles
}

// TestMoneyRoutesDeclareIdempotency: every route whose endpoint reaches a
// money script (moneyCalls, through the Server methods it calls) declares
// beside its registration how a retry under its key is answered: optRerun
// (re-run into the script's op key) or optStored (the stored answer), with
// optIdem; no other route declares either, so the flags cannot rot.
func TestMoneyRoutesDeclareIdempotency(t *testing.T) {
	calls, handles := serverMethods(t)
	memo := map[string]bool{}
	var money func(m string, seen map[string]bool) bool
	money = func(m string, seen map[string]bool) bool {
		if v, ok := memo[m]; ok {
			return v
		}
		if seen[m] {
			return false
		}
		seen[m] = true
		for _, c := range calls[m] {
			if moneyCalls[c] || (!strings.Contains(c, ".") && money(c, seen)) {
				memo[m] = true
				return true
			}
		}
		return false
	}
	var moneyRoutes int
	for _, h := range handles {
		if len(h.Args) != 4 {
			continue // the handle method itself, or another arity
		}
		var ep string
		switch e := h.Args[3].(type) {
		case *ast.SelectorExpr:
			ep = e.Sel.Name
		case *ast.CallExpr:
			if sel, ok := e.Fun.(*ast.SelectorExpr); ok {
				ep = sel.Sel.Name
			}
		}
		if ep == "" {
			t.Errorf("a registration's endpoint is not a Server method: %#v", h.Args[3])
			continue
		}
		opts := map[string]bool{}
		ast.Inspect(h.Args[2], func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				opts[id.Name] = true
			}
			return true
		})
		isMoney := money(ep, map[string]bool{})
		switch {
		case isMoney:
			moneyRoutes++
			if !opts["optIdem"] || opts["optRerun"] == opts["optStored"] {
				t.Errorf("money route with endpoint %s: opts %v, want optIdem and one of optRerun, optStored", ep, opts)
			}
		case opts["optRerun"] || opts["optStored"]:
			t.Errorf("endpoint %s runs no money script but declares %v", ep, opts)
		}
	}
	// consume, usage, increment, decrement, lease renew and release,
	// reserve, commit, release, extend, grant and adjust (registered once
	// for both customer forms).
	if moneyRoutes < 12 {
		t.Errorf("found %d money routes, want at least 12: the scan no longer sees the registrations", moneyRoutes)
	}
}
