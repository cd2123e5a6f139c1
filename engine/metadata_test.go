package engine

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetadataCanonical: metadata comes back sorted and compact with numbers
// as written; each limit refuses one past it and admits the limit itself.
func TestMetadataCanonical(t *testing.T) {
	t.Parallel()
	nest := func(levels int) string { // levels objects below the metadata object
		return strings.Repeat(`{"x":`, levels) + "1" + strings.Repeat("}", levels)
	}
	keys := func(n int) Metadata {
		m := Metadata{}
		for i := 0; i < n; i++ {
			m["k"+strconv.Itoa(i)] = json.RawMessage(`1`)
		}
		return m
	}
	obj := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `"k` + strconv.Itoa(i) + `":1`
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	big := Metadata{}
	for i := 0; i < 40; i++ {
		big["k"+strconv.Itoa(i)] = json.RawMessage(`"` + strings.Repeat("x", 450) + `"`)
	}
	// atCap encodes to exactly MaxMetadataBytes plus extra bytes: 9 members
	// "kN":"..." (7 bytes each besides the value), 8 commas and 2 braces.
	atCap := func(extra int) Metadata {
		m := Metadata{}
		left := MaxMetadataBytes + extra - 2 - 8 - 9*7
		for i := 0; i < 9; i++ {
			n := min(MaxMetadataStringChars, left-(8-i))
			m["k"+strconv.Itoa(i)] = json.RawMessage(`"` + strings.Repeat("x", n) + `"`)
			left -= n
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		in    Metadata
		want  map[string]string // canonical values, when accepted
		kind  Kind
		field string
	}{
		{"nil stays nil", nil, nil, "", ""},
		{"canonical", Metadata{"b": json.RawMessage(` { "z" : 1.50, "a" : [ true , null ] } `), "a": json.RawMessage(`"<&>"`)},
			map[string]string{"b": `{"a":[true,null],"z":1.50}`, "a": `"<&>"`}, "", ""},
		{"unicode kept", Metadata{"é": json.RawMessage(`"\u00e9\ud83d\ude00"`)}, map[string]string{"é": `"é😀"`}, "", ""},
		{"depth 5", Metadata{"a": json.RawMessage(nest(4))}, map[string]string{"a": nest(4)}, "", ""},
		{"depth 6", Metadata{"a": json.RawMessage(nest(5))}, nil, KindBadRequest, "metadata.a.x.x.x.x"},
		{"50 keys", keys(50), nil, "", ""},
		{"51 keys", keys(51), nil, KindValidation, "metadata"},
		{"nested 51 keys", Metadata{"a": json.RawMessage(obj(51))}, nil, KindValidation, "metadata.a"},
		{"key of 40", Metadata{strings.Repeat("k", 40): json.RawMessage(`1`)}, nil, "", ""},
		{"key of 41", Metadata{strings.Repeat("k", 41): json.RawMessage(`1`)}, nil, KindValidation, "metadata"},
		{"nested key of 41", Metadata{"a": json.RawMessage(`{"` + strings.Repeat("k", 41) + `":1}`)}, nil, KindValidation, "metadata.a"},
		{"empty key", Metadata{"": json.RawMessage(`1`)}, nil, KindValidation, "metadata"},
		{"NUL key", Metadata{"a\x00": json.RawMessage(`1`)}, nil, KindBadRequest, "metadata"},
		{"string of 500", Metadata{"a": json.RawMessage(`"` + strings.Repeat("é", 500) + `"`)}, nil, "", ""},
		{"string of 501", Metadata{"a": json.RawMessage(`"` + strings.Repeat("é", 501) + `"`)}, nil, KindValidation, "metadata.a"},
		{"array string of 501", Metadata{"a": json.RawMessage(`[1,"` + strings.Repeat("x", 501) + `"]`)}, nil, KindValidation, "metadata.a[1]"},
		{"40 values of 450 characters", big, nil, KindValidation, "metadata"},
		{"exactly the size cap", atCap(0), nil, "", ""},
		{"a byte over the size cap", atCap(1), nil, KindValidation, "metadata"},
		{"NUL value", Metadata{"a": json.RawMessage(`"\u0000"`)}, nil, KindBadRequest, "metadata.a"},
		{"bad UTF-8 value", Metadata{"a": json.RawMessage("\"\xff\"")}, nil, KindBadRequest, "metadata.a"},
		{"lone surrogate", Metadata{"a": json.RawMessage(`"\udfff"`)}, nil, KindBadRequest, "metadata.a"},
		{"duplicate nested", Metadata{"a": json.RawMessage(`{"b":1,"b":2}`)}, nil, KindBadRequest, "metadata.a.b"},
		{"number too big", Metadata{"a": json.RawMessage(`1e999999`)}, nil, KindValidation, "metadata.a"},
		{"number too small", Metadata{"a": json.RawMessage(`1e-999999`)}, nil, KindValidation, "metadata.a"},
		{"not JSON", Metadata{"a": json.RawMessage(`{`)}, nil, KindBadRequest, ""},
		{"empty value", Metadata{"a": json.RawMessage(``)}, nil, KindBadRequest, "metadata.a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.Canonical("metadata")
			if tc.kind != "" {
				e, ok := AsError(err)
				if !ok || e.Kind != tc.kind || e.Field != tc.field {
					t.Fatalf("err = %v, want kind %s field %q", err, tc.kind, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if (tc.in == nil) != (got == nil) || len(got) != len(tc.in) {
				t.Fatalf("got %v for %v", got, tc.in)
			}
			for k, want := range tc.want {
				if string(got[k]) != want {
					t.Errorf("%s = %s, want %s", k, got[k], want)
				}
			}
			again, err := got.Canonical("metadata")
			if err != nil || !sameMetadata(again, got) {
				t.Fatalf("canonical form is not stable: %v %v", again, err)
			}
		})
	}
}

func sameMetadata(a, b Metadata) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if string(b[k]) != string(v) {
			return false
		}
	}
	return true
}

// TestParseInstant: RFC 3339 within years 0001-9999 (as written and in
// UTC); a malformed one has the caller's kind, an out-of-range one is 400.
func TestParseInstant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		kind Kind
	}{
		{"2030-01-02T03:04:05Z", ""},
		{"0001-01-01T00:00:00Z", ""},
		{"9999-12-31T23:59:59.999Z", ""},
		{"0001-01-01T23:59:00+23:00", ""},
		{"0000-01-01T00:00:00+23:59", KindBadRequest},
		{"0000-06-01T00:00:00Z", KindBadRequest},
		{"0001-01-01T00:00:00+00:01", KindBadRequest},
		{"9999-12-31T23:59:59-00:01", KindBadRequest},
		{"yesterday", KindValidation},
		{"", KindValidation},
	} {
		got, err := ParseInstant("expires_at", tc.in, KindValidation)
		if tc.kind == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.in, err)
				continue
			}
			if _, jerr := json.Marshal(got); jerr != nil {
				t.Errorf("%q parsed to a time JSON cannot encode: %v", tc.in, jerr)
			}
			continue
		}
		e, ok := AsError(err)
		if !ok || e.Kind != tc.kind || e.Field != "expires_at" {
			t.Errorf("%q: err = %v, want kind %s naming expires_at", tc.in, err, tc.kind)
		}
	}
	if _, err := time.Parse(time.RFC3339, "0000-01-01T00:00:00+23:59"); err != nil {
		t.Fatal("premise: Go parses year 0000 with an offset")
	}
}

// TestCleanText: C0 controls and bad UTF-8 are refused; multi-line only
// lets tab and line breaks through.
func TestCleanText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in              string
		line, multiline bool
	}{
		{"plain é 😀 \x7f", true, true},
		{"a\tb\nc\r", false, true},
		{"a\x00", false, false},
		{"\x1f", false, false},
		{"\xff", false, false},
		{"\xed\xa0\x80", false, false},
		{"", true, true},
	} {
		if got := CheckLine("f", tc.in) == nil; got != tc.line {
			t.Errorf("CheckLine(%q) ok = %v, want %v", tc.in, got, tc.line)
		}
		if got := CheckText("f", tc.in) == nil; got != tc.multiline {
			t.Errorf("CheckText(%q) ok = %v, want %v", tc.in, got, tc.multiline)
		}
	}
}

// TestNumericText pins the Postgres numeric output form the door writes
// numbers in (persist's TestMetadataSurvivesJSONB checks it against jsonb).
func TestNumericText(t *testing.T) {
	cases := []struct{ in, want string }{
		{"0", "0"}, {"-0", "0"}, {"-0.0", "0.0"}, {"12", "12"}, {"-12", "-12"},
		{"1e2", "100"}, {"1E+2", "100"}, {"1.50e1", "15.0"}, {"1e-3", "0.001"},
		{"123.456e-1", "12.3456"}, {"0.000", "0.000"}, {"-12.5e-3", "-0.0125"},
		{"9223372036854775808", "9223372036854775808"}, {"2.0", "2.0"}, {"5e0", "5"},
	}
	for _, c := range cases {
		if got := numericText(c.in); got != c.want {
			t.Errorf("numericText(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
