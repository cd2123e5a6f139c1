package lua

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// The contract between Go and the scripts: every constant, code and name
// the two sides share is held equal here, and each script's arguments are
// one Go description (argv.go) checked against the .lua that reads them.
// The encodings' field orders are held by running both sides:
// TestLoadEncodingMatchesPrelude (block_enc and res_enc against
// blockValue and reservationValue) and the decode test beside it (decodeBlock).

// luaConst is the value of `local NAME = value` in src: a number (products
// of integers evaluated), a quoted string, or a table literal's text.
func luaConst(t *testing.T, src, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^local ` + name + ` = ([^\n]+(?:\n  [^\n]+)*)`).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("no `local %s` in the Lua", name)
	}
	v := strings.TrimSpace(m[1])
	if regexp.MustCompile(`^\d+( \* \d+)*$`).MatchString(v) {
		n := int64(1)
		for _, f := range strings.Split(v, " * ") {
			x, _ := strconv.ParseInt(f, 10, 64)
			n *= x
		}
		return strconv.FormatInt(n, 10)
	}
	return v
}

// luaTable reads a table literal {a = 'x', b = 'y'} of string values.
func luaTable(t *testing.T, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+) = '([^']*)'`).FindAllStringSubmatch(text, -1) {
		out[m[1]] = m[2]
	}
	if len(out) == 0 {
		t.Fatalf("not a table of strings: %s", text)
	}
	return out
}

// TestLuaConstantsMatchGo: each constant the prelude (prelude/) keeps is the Go value
// it mirrors.
func TestLuaConstantsMatchGo(t *testing.T) {
	for _, tc := range []struct {
		lua  string
		want int64
	}{
		{"MAX_LIVE_BLOCKS", engine.MaxLiveBlocks},
		{"MAX_ACTIVE_RESERVATIONS", engine.MaxActiveReservations},
		{"MAX_KEPT_RESERVATIONS", maxKeptReservations},
		{"MAX_GAUGE_LEASES", engine.MaxGaugeLeases},
		{"RES_KEEP_MS", reservationKeep.Milliseconds()},
		{"LAYOUT_MIN_ITEMS", layoutMinItems},
		{"OP_RECORD_CONSUME", opRecordConsume},
	} {
		if got := luaConst(t, preludeLua, tc.lua); got != strconv.FormatInt(tc.want, 10) {
			t.Errorf("prelude %s = %s, Go says %d", tc.lua, got, tc.want)
		}
	}

	codes := map[string]string{}
	for src, code := range sourceCodes {
		codes[string(src)] = code
	}
	names := map[string]string{}
	for code, src := range sourceNames {
		names[code] = string(src)
	}
	reservations := map[string]string{}
	reservationNames := map[string]string{}
	for st, code := range reservationCodes {
		reservations[string(st)], reservationNames[code] = code, string(st)
	}
	for _, tc := range []struct {
		lua  string
		want map[string]string
	}{
		{"SOURCE_CODE", codes},
		{"SOURCE_NAME", names},
		{"RES_CODE", reservations},
		{"RES_NAME", reservationNames},
	} {
		if got := luaTable(t, luaConst(t, preludeLua, tc.lua)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("prelude %s = %v, Go says %v", tc.lua, got, tc.want)
		}
	}
	for _, src := range []engine.Source{engine.SourcePlanGrant, engine.SourceTopup, engine.SourcePromotional,
		engine.SourceCompensation, engine.SourceReferral, engine.SourceManual, engine.SourceMigration} {
		if _, ok := sourceCodes[src]; !ok {
			t.Errorf("source %q has no code", src)
		}
	}
}

// TestLuaNamesAreGoNames: the kinds, statuses, policies and cost types the
// scripts write or compare are engine's, and the item limit of the multi
// scripts is engine.MaxConsumeItems.
func TestLuaNamesAreGoNames(t *testing.T) {
	kinds := map[string]bool{}
	for _, k := range []engine.MutationKind{engine.MutationGrant, engine.MutationDebit, engine.MutationExpire,
		engine.MutationConsume, engine.MutationReserve, engine.MutationCommit, engine.MutationRelease,
		engine.MutationGaugeKind, engine.MutationRollover} {
		kinds[string(k)] = true
	}
	statuses := map[string]bool{}
	for st := range reservationCodes {
		statuses[string(st)] = true
	}
	policies := map[string]bool{string(engine.OveragePolicyBlock): true, string(engine.OveragePolicyAllow): true,
		string(engine.OveragePolicyNotify): true}
	costs := map[string]bool{string(engine.CostFlat): true, string(engine.CostPerUnit): true,
		string(engine.CostTiered): true, string(engine.TierVolume): true, string(engine.TierGraduated): true}
	for _, file := range scriptFiles(t) {
		src := readLua(t, file)
		for _, tc := range []struct {
			what, pattern string
			known         map[string]bool
		}{
			{"kind", `kind = '(\w+)'`, kinds},
			{"reservation status", `r\.status [=~]= '(\w+)'|r\.status, [^\n]*= '(\w+)'`, statuses},
			{"policy", `policy [=~]= '(\w+)'`, policies},
			{"cost type", `t\.(?:kind|mode) [=~]= '(\w+)'`, costs},
		} {
			for _, m := range regexp.MustCompile(tc.pattern).FindAllStringSubmatch(src, -1) {
				name := m[1]
				if name == "" && len(m) > 2 {
					name = m[2]
				}
				if !tc.known[name] {
					t.Errorf("%s: %s %q is not engine's", file, tc.what, name)
				}
			}
		}
		for _, m := range regexp.MustCompile(`n < 1 or n > (\d+)`).FindAllStringSubmatch(src, -1) {
			if m[1] != strconv.Itoa(engine.MaxConsumeItems) {
				t.Errorf("%s: at most %s items, engine.MaxConsumeItems is %d", file, m[1], engine.MaxConsumeItems)
			}
		}
	}
}

func scriptFiles(t *testing.T) []string {
	t.Helper()
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".lua") {
			out = append(out, f.Name())
		}
	}
	return out
}

func readLua(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// argvLister is a script's argument description (argv.go).
type argvLister interface{ list() []any }

// argvShape is a description's argument names: fixed positions, the
// repeated item group and what follows the items.
type argvShape struct {
	fixed, items, tail []string
}

// shapeOf reads the lua tags of description type typ, in field order.
func shapeOf(typ reflect.Type, sh *argvShape, into *[]string) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("lua")
		name, opt, _ := strings.Cut(tag, ",")
		switch {
		case f.Type.Kind() == reflect.String:
			*into = append(*into, name)
		case f.Type.Kind() == reflect.Slice:
			shapeOf(f.Type.Elem(), sh, &sh.items)
		case opt == "tail":
			shapeOf(f.Type, sh, &sh.tail)
		case f.Type.Kind() == reflect.Struct:
			shapeOf(f.Type, sh, into)
		}
	}
}

// fill sets every string of v to a distinct text, with two items in each
// slice, and returns the texts in the order list must write them.
func fill(v reflect.Value, n *int, fixed, items, tail *[]string) {
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		_, opt, _ := strings.Cut(sf.Tag.Get("lua"), ",")
		switch {
		case f.Kind() == reflect.String:
			*n++
			f.SetString("v" + strconv.Itoa(*n))
			*fixed = append(*fixed, f.String())
		case f.Kind() == reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 2, 2))
			for j := range 2 {
				var none []string
				fill(f.Index(j), n, items, &none, &none)
			}
		case opt == "tail":
			var none []string
			fill(f, n, tail, &none, &none)
		case f.Kind() == reflect.Struct:
			fill(f, n, fixed, items, tail)
		}
	}
}

// luaArgv maps how a script reads ARGV to the names of the locals (or
// table members) it reads them into: fixed positions, item offsets
// (ARGV[at + k]) and positions after the items (ARGV[b + s * n]).
func luaArgv(src string) (fixed map[int]string, items map[int]string, tail map[string]string) {
	fixed, items, tail = map[int]string{}, map[int]string{}, map[string]string{}
	local := regexp.MustCompile(`^\s*local ([\w, ]+) = (.+)$`)
	member := regexp.MustCompile(`(\w+) = [\w.]*\(?ARGV\[at \+ (\d+)\]`)
	index := regexp.MustCompile(`ARGV\[([^\]]+)\]`)
	note := func(name, idx string) {
		if k, err := strconv.Atoi(idx); err == nil {
			if _, ok := fixed[k]; !ok {
				fixed[k] = name
			}
		} else if rest, ok := strings.CutPrefix(idx, "at + "); ok {
			k, _ := strconv.Atoi(rest)
			if _, ok := items[k]; !ok {
				items[k] = name
			}
		} else if _, ok := tail[idx]; !ok {
			tail[idx] = name
		}
	}
	for _, line := range strings.Split(src, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		if m := local.FindStringSubmatch(line); m != nil {
			names := strings.Split(m[1], ",")
			exprs := splitTop(m[2])
			for i := range min(len(names), len(exprs)) {
				// A table constructor's members are named below.
				if x := index.FindStringSubmatch(exprs[i]); x != nil && !strings.HasPrefix(strings.TrimSpace(exprs[i]), "{") {
					note(strings.TrimSpace(names[i]), x[1])
				}
			}
		}
		for _, m := range member.FindAllStringSubmatch(line, -1) {
			note(m[1], "at + "+m[2])
		}
	}
	return fixed, items, tail
}

// withArgvReaders is script src followed by the prelude functions it
// hands ARGV to (items.lua's item readers), read as part of the script:
// a function of the library sees ARGV only as its parameter argv.
func withArgvReaders(src string) string {
	var b strings.Builder
	b.WriteString(src)
	done := map[string]bool{}
	for _, m := range regexp.MustCompile(`(\w+)\(ARGV\b`).FindAllStringSubmatch(src, -1) {
		if done[m[1]] {
			continue
		}
		done[m[1]] = true
		for _, c := range splitPrelude(preludeLua) {
			if len(c.defines) == 1 && c.defines[0] == m[1] {
				b.WriteString("\n" + strings.ReplaceAll(c.text, "argv[", "ARGV["))
			}
		}
	}
	return b.String()
}

// splitTop splits a Lua expression list at its top-level commas.
func splitTop(s string) []string {
	var out []string
	depth, start, quote := 0, 0, byte(0)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case c == ',' && depth == 0:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// TestArgvMatchesScripts: each script's Go description names the locals
// its .lua reads, at the same ARGV positions and no more, and its list
// writes every field, in field order.
func TestArgvMatchesScripts(t *testing.T) {
	for _, tc := range []struct {
		script string
		argv   argvLister
	}{
		{"consume.lua", &consumeArgv{}},
		{"consume_multi.lua", &consumeMultiArgv{}},
		{"reserve.lua", &reserveArgv{}},
		{"reserve_multi.lua", &reserveMultiArgv{}},
		{"commit.lua", &commitArgv{}},
		{"commit_multi.lua", &commitMultiArgv{}},
		{"release.lua", &releaseArgv{}},
		{"extend.lua", &extendArgv{}},
		{"gauge.lua", &gaugeArgv{}},
		{"lease.lua", &leaseArgv{}},
		{"grant.lua", &grantArgv{}},
		{"debit.lua", &debitArgv{}},
		{"rollover.lua", &rolloverArgv{}},
		{"expire.lua", &expireArgv{}},
	} {
		t.Run(tc.script, func(t *testing.T) {
			var sh argvShape
			shapeOf(reflect.TypeOf(tc.argv).Elem(), &sh, &sh.fixed)
			fixed, items, tail := luaArgv(withArgvReaders(readLua(t, tc.script)))
			if got := ordered(fixed); !reflect.DeepEqual(got, sh.fixed) {
				t.Errorf("ARGV[1..]: %s reads %v, Go sends %v", tc.script, got, sh.fixed)
			}
			if got := ordered(items); len(got)+len(sh.items) > 0 && !reflect.DeepEqual(got, sh.items) {
				t.Errorf("items: %s reads %v, Go sends %v", tc.script, got, sh.items)
			}
			want := map[string]string{}
			for i, name := range sh.tail {
				want[fmt.Sprintf("%d + %d * n", len(sh.fixed)+1+i, len(sh.items))] = name
			}
			if !reflect.DeepEqual(tail, want) {
				t.Errorf("after the items: %s reads %v, Go sends %v", tc.script, tail, want)
			}

			var n int
			var f, it, tl []string
			fill(reflect.ValueOf(tc.argv).Elem(), &n, &f, &it, &tl)
			wantList := append(append(f, it...), tl...)
			var gotList []string
			for _, v := range tc.argv.list() {
				if p, ok := v.(*string); ok { // the hot lists send pointers (argv.go put)
					v = *p
				}
				gotList = append(gotList, v.(string))
			}
			if !reflect.DeepEqual(gotList, wantList) {
				t.Errorf("list() = %v, want the fields in order %v", gotList, wantList)
			}
		})
	}
}

// ordered is m's values by key 1..n; a gap is an empty name.
func ordered(m map[int]string) []string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	if len(keys) == 0 {
		return nil
	}
	out := make([]string, keys[len(keys)-1])
	for k, v := range m {
		out[k-1] = v
	}
	return out
}
