package main

import "testing"

func TestPprofPackage(t *testing.T) {
	for _, tc := range []struct{ sym, want string }{
		{"runtime.mallocgc", "runtime"},
		{"github.com/valyala/fasthttp.(*Server).serveConn", "github.com/valyala/fasthttp"},
		{"github.com/creditd/creditd/api.(*Server).handle.func1", "api"},
		{"internal/runtime/syscall.Syscall6", "internal/runtime/syscall"},
		{"syscall.Syscall", "syscall"},
	} {
		if got := pprofPackage(tc.sym); got != tc.want {
			t.Errorf("pprofPackage(%q) = %q, want %q", tc.sym, got, tc.want)
		}
	}
}

func TestParsePprofTop(t *testing.T) {
	out := []byte(`File: creditd
Type: cpu
Duration: 5s, Total samples = 2.50s (50.00%)
Showing nodes accounting for 2.50s, 100% of 2.50s total
      flat  flat%   sum%        cum   cum%
     1.20s 48.00% 48.00%      1.20s 48.00%  internal/runtime/syscall.Syscall6
     800ms 32.00% 80.00%      900ms 36.00%  runtime.mallocgc
     500ms 20.00%   100%      2.50s   100%  github.com/creditd/creditd/api.(*Server).handle
`)
	total, funcs := parsePprofTop(out)
	if total != 2.5 {
		t.Fatalf("total = %v, want 2.5", total)
	}
	if len(funcs) != 3 || funcs[1].Name != "runtime.mallocgc" || funcs[1].Share != 0.8 || funcs[2].Name != "github.com/creditd/creditd/api.(*Server).handle" {
		t.Fatalf("funcs = %+v", funcs)
	}
}
