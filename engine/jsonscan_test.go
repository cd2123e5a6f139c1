package engine

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// scanProbe is a body type with the shapes ScanJSON distinguishes: scalars,
// free text, a nested struct, a list of structs, a map and opaque JSON.
type scanProbe struct {
	Units    *int64         `json:"units"`
	Reason   *string        `json:"reason"`
	Name     *string        `json:"name"`
	Stack    *scanProbeLeaf `json:"stack_after"`
	Events   []scanProbeLeaf
	Tags     map[string]string `json:"tags"`
	Metadata Metadata          `json:"metadata"`
	Ignored  string            `json:"-"`
}

type scanProbeLeaf struct {
	EventID  *string `json:"event_id"`
	Fallback *string `json:"fallback"`
}

// TestScanJSON: every refusal is a 400 (422 for numbers) naming the member
// by its path; clean documents pass.
func TestScanJSON(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40)
	deepArr := `{"metadata":{"m":` + strings.Repeat("[", 31) + strings.Repeat("]", 31) + `}}`
	manyKeys := func(dupAt int) string {
		var b strings.Builder
		b.WriteString(`{"tags":{`)
		for i := 0; i < 40; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			k := "k" + strconv.Itoa(i)
			if i == dupAt {
				k = "k1"
			}
			b.WriteString(`"` + k + `":"v"`)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	for _, tc := range []struct {
		name, doc string
		kind      Kind
		field     string
	}{
		{"clean", `{"units":1,"reason":"why","metadata":{"a":[1,{"b":null}],"c":"é😀"}}`, "", ""},
		{"unknown members ignored", `{"zzz":{"a":"x\ty"},"units":1}`, "", ""},
		{"escaped pair", `{"reason":"\ud83d\ude00"}`, "", ""},
		{"multi-line reason", `{"reason":"a\nb\r\tc"}`, "", ""},
		{"multi-line metadata value", `{"metadata":{"a":"x\ny"}}`, "", ""},
		{"max exponent", `{"metadata":{"a":1e300,"b":-2.5E-300}}`, "", ""},
		{"32 levels", `{"metadata":{"m":` + strings.Repeat("[", 30) + strings.Repeat("]", 30) + `}}`, "", ""},
		{"promoted field of untagged struct", `{"Events":[{"event_id":"e"}]}`, "", ""},
		{"map of 40 keys", manyKeys(-1), "", ""},

		{"NUL escape in metadata", `{"metadata":{"a":"\u0000"}}`, KindBadRequest, "metadata.a"},
		{"NUL escape in reason", `{"reason":"x\u0000"}`, KindBadRequest, "reason"},
		{"raw control byte", "{\"reason\":\"x\x01\"}", KindBadRequest, "reason"},
		{"backspace escape", `{"reason":"x\b"}`, KindBadRequest, "reason"},
		{"line feed in identifier", `{"name":"a\nb"}`, KindBadRequest, "name"},
		{"tab in nested identifier", `{"Events":[{"event_id":"a"},{"event_id":"\t"}]}`, KindBadRequest, "Events[1].event_id"},
		{"invalid UTF-8", "{\"metadata\":{\"a\":\"\xff\"}}", KindBadRequest, "metadata.a"},
		{"encoded surrogate", "{\"reason\":\"\xed\xa0\x80\"}", KindBadRequest, "reason"},
		{"lone high surrogate", `{"reason":"\ud800"}`, KindBadRequest, "reason"},
		{"lone low surrogate", `{"reason":"\udc00x"}`, KindBadRequest, "reason"},
		{"high then non-low", `{"reason":"\ud800\u0041"}`, KindBadRequest, "reason"},
		{"NUL in member name", `{"metadata":{"a\u0000":1}}`, KindBadRequest, "metadata"},
		{"bad UTF-8 in member name", "{\"metadata\":{\"\xc3\":1}}", KindBadRequest, "metadata"},
		{"duplicate top-level", `{"units":1,"units":2}`, KindBadRequest, "units"},
		{"duplicate nested", `{"metadata":{"a":1,"b":{"c":1,"c":2}}}`, KindBadRequest, "metadata.b.c"},
		{"duplicate via escape", `{"units":1,"\u0075nits":2}`, KindBadRequest, "units"},
		{"duplicate in big object", manyKeys(30), KindBadRequest, "tags.k1"},
		{"case-insensitive member", `{"units":1,"UNITS":-100}`, KindBadRequest, "UNITS"},
		{"case-insensitive alone", `{"Units":5}`, KindBadRequest, "Units"},
		{"kelvin sign folds", `{"metadata":{},"stac\u212a_after":{}}`, KindBadRequest, "stac\u212a_after"},
		{"case-insensitive nested", `{"stack_after":{"FALLBACK":"now"}}`, KindBadRequest, "stack_after.FALLBACK"},
		{"case-insensitive in list", `{"Events":[{"Event_ID":"x"}]}`, KindBadRequest, "Events[0].Event_ID"},
		{"deep", deep, KindBadRequest, "a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a"},
		{"deep arrays", deepArr, KindBadRequest, "metadata.m" + strings.Repeat("[0]", 30)},
		{"huge exponent", `{"metadata":{"a":1e999999}}`, KindValidation, "metadata.a"},
		{"tiny exponent", `{"metadata":{"a":1e-999999}}`, KindValidation, "metadata.a"},
		{"exponent 301", `{"units":1e301}`, KindValidation, "units"},
		{"long digits", `{"units":` + strings.Repeat("9", 101) + `}`, KindValidation, "units"},
		{"long number", `{"units":0.` + strings.Repeat("1", 100) + `}`, KindValidation, "units"},
		{"float overflow", `{"metadata":{"a":9e300,"b":[` + strings.Repeat("9", 20) + `e300]}}`, KindValidation, "metadata.b[0]"},
		{"syntax", `{"units":}`, KindBadRequest, ""},
		{"trailing", `{"units":1} x`, KindBadRequest, ""},
		{"unterminated", `{"reason":"abc`, KindBadRequest, ""},
		{"leading zero", `{"units":01}`, KindBadRequest, ""},
		{"bad escape", `{"reason":"\x"}`, KindBadRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ScanJSON([]byte(tc.doc), "", ShapeOf(reflect.TypeFor[*scanProbe]()), MaxJSONDepth)
			if tc.kind == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			e, ok := AsError(err)
			if !ok || e.Kind != tc.kind {
				t.Fatalf("err = %v, want kind %s", err, tc.kind)
			}
			if e.Field != tc.field {
				t.Fatalf("field = %q, want %q (%v)", e.Field, tc.field, err)
			}
		})
	}
}

// TestShapeOf: exact json names, "-" skipped, untagged fields by Go name,
// opaque types (Metadata values, time) left free-form.
func TestShapeOf(t *testing.T) {
	t.Parallel()
	sh := ShapeOf(reflect.TypeFor[scanProbe]())
	if sh.kind != shapeStruct {
		t.Fatalf("kind = %d", sh.kind)
	}
	for _, name := range []string{"units", "reason", "name", "stack_after", "Events", "tags", "metadata"} {
		if _, ok := sh.members[name]; !ok {
			t.Errorf("member %q missing", name)
		}
	}
	for _, name := range []string{"Ignored", "-"} {
		if _, ok := sh.members[name]; ok {
			t.Errorf("member %q should not bind", name)
		}
	}
	if m := sh.members["metadata"]; m.kind != shapeList || m.elem.kind != shapeOpaque {
		t.Errorf("metadata shape = %+v, want a map of opaque values", m)
	}
	if ShapeOf(reflect.TypeFor[*scanProbe]()) != sh {
		t.Error("shape not cached per type")
	}
}

// shapeRaceProbe is used by no other test, so its shape is built under race.
type shapeRaceProbe struct {
	A    *int64            `json:"a"`
	Next *shapeRaceProbe   `json:"next"`
	M    map[string]string `json:"m"`
}

// TestShapeOfConcurrent: first use of a type from many goroutines shares one
// fully built shape (run with -race); a recursive type ends.
func TestShapeOfConcurrent(t *testing.T) {
	t.Parallel()
	done := make(chan *Shape)
	for i := 0; i < 8; i++ {
		go func() {
			sh := ShapeOf(reflect.TypeFor[shapeRaceProbe]())
			if err := ScanJSON([]byte(`{"next":{"next":{"A":1}}}`), "", sh, MaxJSONDepth); err == nil {
				t.Error("case-folded member in a recursive type passed")
			}
			done <- sh
		}()
	}
	first := <-done
	for i := 1; i < 8; i++ {
		if sh := <-done; sh != first {
			t.Error("two shapes for one type")
		}
	}
	if first.members["next"] != first {
		t.Error("recursive member does not point back at its type")
	}
}

// FuzzScanJSON: ScanJSON never accepts what encoding/json rejects, and what
// it accepts decodes to clean text (no C0 control but tab and line breaks,
// no U+FFFD that the document did not spell) and no repeated member.
func FuzzScanJSON(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":"\u0000"}`, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":1,"a":2}`,
		`{"a":[1e300,-0.5,{"b":null}]}`, `{"a":1e999999}`, `[[[[]]]]`, `"\ud83d\ude00"`, `{"a":"\t\n"}`, `{"A":1,"a":2}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		err := ScanJSON(doc, "", nil, MaxJSONDepth)
		if err != nil {
			if _, ok := AsError(err); !ok {
				t.Fatalf("non-engine error %v", err)
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("accepted invalid JSON %q", doc)
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("accepted %q that does not decode: %v", doc, err)
		}
		spelled := bytes.Contains(doc, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(doc), []byte(`\ufffd`))
		var walk func(v any)
		walk = func(v any) {
			switch x := v.(type) {
			case string:
				if !cleanText(x, true) || (!spelled && strings.ContainsRune(x, utf8.RuneError)) {
					t.Fatalf("accepted %q holding unclean text %q", doc, x)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			case map[string]any:
				for k, e := range x {
					if !cleanText(k, false) || (!spelled && strings.ContainsRune(k, utf8.RuneError)) {
						t.Fatalf("accepted %q holding unclean member name %q", doc, k)
					}
					walk(e)
				}
			}
		}
		walk(v)
	})
}
