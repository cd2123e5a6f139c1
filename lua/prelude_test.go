package lua

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxFunctionLines is the longest a Lua function of lua/prelude/ may run,
// its first line and its closing "end" included (issue 29): past it a
// function does more than one job, and reading it means holding all of
// them at once.
const maxFunctionLines = 70

// luaFunctionDef opens a named function: a local function, or a function
// assigned to a local declared before it (a do block's, link.go), at any
// indentation.
var luaFunctionDef = regexp.MustCompile(`^( *)(?:local )?function ([A-Za-z_][A-Za-z0-9_]*)\(`)

// luaFunctionLengths is the length in lines of each named function of src
// (from its definition to the "end" at its indentation, both included),
// by its name; a one-line function is not counted.
func luaFunctionLengths(src string) map[string]int {
	out := map[string]int{}
	type open struct {
		name, end string
		start     int
	}
	var stack []open
	for i, line := range strings.Split(src, "\n") {
		if len(stack) > 0 && line == stack[len(stack)-1].end {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			out[f.name] = i - f.start + 1
			continue
		}
		if m := luaFunctionDef.FindStringSubmatch(line); m != nil && !strings.HasSuffix(line, " end") {
			stack = append(stack, open{name: m[2], end: m[1] + "end", start: i})
		}
	}
	return out
}

// TestPreludeOrder: every file of lua/prelude/ is in preludeOrder once,
// and no definition of the assembled prelude uses a name defined only
// after it (Lua would read that name as a global, which Redis refuses) or
// defines a name another already did. The chunk keeps under Lua's 200
// locals with the library's own (library.go, door_fused.lua).
func TestPreludeOrder(t *testing.T) {
	files, err := fs.Glob(preludeFS, "prelude/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]int{}
	for _, name := range preludeOrder {
		listed[name]++
		if listed[name] == 2 {
			t.Errorf("preludeOrder lists %s twice", name)
		}
	}
	for _, f := range files {
		name := strings.TrimPrefix(f, "prelude/")
		if listed[name] == 0 {
			t.Errorf("lua/prelude/%s is not in preludeOrder (lua/prelude.go)", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("preludeOrder lists %s, which lua/prelude/ lacks", name)
	}

	chunks := splitPrelude(preludeLua)
	definedAt := map[string]int{}
	for i, c := range chunks {
		for _, n := range c.defines {
			if j, ok := definedAt[n]; ok {
				t.Errorf("%s is defined twice (chunks %d and %d)", n, j, i)
			}
			definedAt[n] = i
		}
	}
	locals := 0
	for i, c := range chunks {
		locals += len(c.defines)
		for id := range c.uses {
			if j, ok := definedAt[id]; ok && j > i {
				t.Errorf("%v uses %s, defined after it: move its file after %s's in preludeOrder", c.defines, id, id)
			}
		}
	}
	// The library adds BODY and door_fused.lua's locals to the chunk.
	for _, line := range strings.Split(doorFusedLua, "\n") {
		if strings.HasPrefix(line, "local ") {
			locals++
		}
	}
	if locals+1 >= 200 {
		t.Errorf("the library's chunk defines %d top-level locals; Lua allows 200", locals+1)
	}
}

// TestPreludeFunctionsShort: no function of lua/prelude/ runs past
// maxFunctionLines.
func TestPreludeFunctionsShort(t *testing.T) {
	for _, name := range preludeOrder {
		src, err := preludeFS.ReadFile("prelude/" + name)
		if err != nil {
			t.Fatal(err)
		}
		for fn, n := range luaFunctionLengths(string(src)) {
			if n > maxFunctionLines {
				t.Errorf("lua/prelude/%s: %s runs %d lines, past %d: split it into helpers of one job each", name, fn, n, maxFunctionLines)
			}
		}
	}
}

// scriptBodyLines is how many lines the body of script src runs, from its
// first line of code to its last non-blank line: the header comment above
// it (what the script does, its KEYS and ARGV, its replies) is the
// script's documentation, not its code.
func scriptBodyLines(src string) int {
	lines := strings.Split(src, "\n")
	first := 0
	for first < len(lines) {
		l := strings.TrimSpace(lines[first])
		if l != "" && !strings.HasPrefix(l, "--") {
			break
		}
		first++
	}
	last := len(lines) - 1
	for last >= first && strings.TrimSpace(lines[last]) == "" {
		last--
	}
	return last - first + 1
}

func TestScriptBodyLines(t *testing.T) {
	for _, c := range []struct {
		src  string
		want int
	}{
		{"-- a.lua does a\n--\n-- KEYS[1] a\n\nlocal x = 1\n-- why\nreturn x\n\n", 3},
		{"local x = 1\nreturn x", 2},
		{"-- only a comment\n", 0},
	} {
		if got := scriptBodyLines(c.src); got != c.want {
			t.Errorf("scriptBodyLines(%q) = %d, want %d", c.src, got, c.want)
		}
	}
}

// TestScriptBodiesShort: no script of lua/ runs a body past
// maxFunctionLines (issue 29), nor defines a function that does. Each body
// is a function of the library (library.go), so it is held to the
// prelude's limit; a job it outgrows becomes a prelude function (made once
// per library load), not a local function of the script (a new closure on
// every call).
func TestScriptBodiesShort(t *testing.T) {
	files, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no script in lua/")
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := scriptBodyLines(string(src)); n > maxFunctionLines {
			t.Errorf("lua/%s: its body runs %d lines, past %d: move its jobs into prelude functions of one job each (lua/prelude/)", f, n, maxFunctionLines)
		}
		for fn, n := range luaFunctionLengths(string(src)) {
			if n > maxFunctionLines {
				t.Errorf("lua/%s: %s runs %d lines, past %d", f, fn, n, maxFunctionLines)
			}
		}
	}
}
