package lua

import (
	"strings"
	"testing"
)

// TestLinkKeepsWhatIsUsed: a script gets the definitions it names and those
// they name in turn, in prelude order, and nothing else.
func TestLinkKeepsWhatIsUsed(t *testing.T) {
	prelude := strings.Join([]string{
		"-- A is a constant.",
		"local A = 1",
		"local B = {x = 1}",
		"local C = {}",
		"for k, v in pairs(B) do C[v] = k end",
		"",
		"-- f uses A.",
		"local function f(x)",
		"  local y = x + A",
		"  return y",
		"end",
		"local function g() return C end",
		"local function h() return f(2) end",
	}, "\n")
	for _, tc := range []struct {
		body      string
		want, not []string
	}{
		{"return h()", []string{"local A = 1", "local function f", "local function h", "-- f uses A."}, []string{"local B", "local C", "local function g"}},
		{"return g()", []string{"local B", "local C", "for k, v in pairs(B)", "local function g"}, []string{"local A", "local function f", "local function h"}},
		{"return 1", nil, []string{"local"}},
	} {
		out := link(prelude, tc.body)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("link(%q) lacks %q:\n%s", tc.body, w, out)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(out, w) {
				t.Errorf("link(%q) keeps %q:\n%s", tc.body, w, out)
			}
		}
		if !strings.HasSuffix(out, tc.body) {
			t.Errorf("link(%q) does not end with the body", tc.body)
		}
	}
	if i, j := strings.Index(link(prelude, "return h()"), "local A"), strings.Index(link(prelude, "return h()"), "local function h"); i > j {
		t.Errorf("prelude order lost")
	}
}
