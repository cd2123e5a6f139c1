package lua

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/redis/go-redis/v9"
)

// metaMergeLua runs prelude/metadata.lua's meta_merge, the merge commit.lua still
// does when Go did not (ARGV[15] absent).
var metaMergeLua = redis.NewScript(preludeLua + "\nreturn meta_merge(ARGV[1], ARGV[2]) or false")

// decodeLastWins decodes a JSON object as Postgres jsonb and
// engine.Metadata read it: a repeated key keeps its last value, numbers
// keep their digits.
func decodeLastWins(t *testing.T, s string) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return m
}

// TestMergeMetaMatchesLua: Go's commit metadata merge (bounded.go
// mergeMeta) and the Lua one it replaced give the same object, key by key,
// on stored and incoming metadata with escaped spellings of one key,
// repeated keys inside one side and across both, nested objects, long
// numbers and odd whitespace: the Mutation, and so Postgres, cannot tell
// which merged.
func TestMergeMetaMatchesLua(t *testing.T) {
	cases := []struct{ stored, incoming string }{
		{``, `{"a":1}`},
		{`{"a":1}`, ``},
		{`{"a":1,"b":"x"}`, `{"b":"y","c":12345678901234567890}`},
		{`{"\u0061":1,"b":2}`, `{"a":3}`},
		{`{"a":1}`, `{"\u0061":"esc","\/k":true}`},
		{`{"/k":1,"a\"q":2}`, `{"\/k":0,"a\u0022q":[1,{"x":null}]}`},
		{`{"a":1,"a":2,"b":3}`, `{"c":4}`},
		{`{"a":1,"a":2}`, `{"a":5}`},
		{`{"x":1}`, `{"a":1,"a":2,"a":3}`},
		{`{"n":{"deep":{"a":1}},"s":"<&>"}`, `{"n":{"deep":2},"t":"é\u00e9"}`},
		{` { "a" : 1.50e3 , "b" : [ 1 , 2 ] } `, ` {"c" : -0.0 } `},
		{`{"a":1}`, `{}`},
		{`{}`, `{"a":{}}`},
		{`{"k,}":"a,}{[","z":"]"}`, `{"k,}":"b"}`},
	}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		for _, c := range cases {
			lua, err := metaMergeLua.Run(ctx, b.rdb, nil, c.stored, c.incoming).Text()
			if err != nil {
				t.Fatalf("lua merge of %s and %s: %v", c.stored, c.incoming, err)
			}
			goText, err := mergeMeta(c.stored, c.incoming)
			if err != nil {
				t.Fatalf("go merge of %s and %s: %v", c.stored, c.incoming, err)
			}
			if l, g := decodeLastWins(t, lua), decodeLastWins(t, goText); !reflect.DeepEqual(l, g) {
				t.Errorf("merge of %s and %s: lua %s, go %s", c.stored, c.incoming, lua, goText)
			}
		}
	})
}
