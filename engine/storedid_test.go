package engine

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// TestStoredIDForms: both stored forms read back as the same id, anything
// else is refused, and the compact form sorts as the UUID text does.
func TestStoredIDForms(t *testing.T) {
	id := uuid.MustParse("0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64")
	compact := CompactID(id)
	if len(compact) != CompactIDLen {
		t.Fatalf("CompactID = %q, %d characters", compact, len(compact))
	}
	for _, tc := range []struct {
		in   string
		want uuid.UUID
		ok   bool
	}{
		{compact, id, true},
		{id.String(), id, true},
		{CompactID(uuid.Nil), uuid.Nil, true},
		{CompactID(uuid.Max), uuid.Max, true},
		{compact[:21], uuid.Nil, false},
		{compact[:21] + "=", uuid.Nil, false},
		{compact[:21] + "+", uuid.Nil, false},
		{compact[:20] + "AB", uuid.Nil, false}, // stray low bits in the last character
		{"", uuid.Nil, false},
	} {
		got, err := ParseStoredID(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseStoredID(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
	// An account hash keeps the compact form only.
	if got, err := ParseCompactID(compact); err != nil || got != id {
		t.Errorf("ParseCompactID(compact) = %v, %v", got, err)
	}
	if _, err := ParseCompactID(id.String()); err == nil {
		t.Error("ParseCompactID took UUID text")
	}
	if got := StoredIDText(compact); got != id.String() {
		t.Errorf("StoredIDText(compact) = %q", got)
	}
	for _, s := range []string{"", id.String(), "not-an-id"} {
		if got := StoredIDText(s); got != s {
			t.Errorf("StoredIDText(%q) = %q", s, got)
		}
	}
	ids := make([]uuid.UUID, 200)
	for i := range ids {
		ids[i] = uuid.New()
	}
	ids = append(ids, uuid.Nil, uuid.Max, uuid.MustParse("00000000-0000-0000-0000-000000000001"),
		uuid.MustParse("00000000-0000-0000-0000-000000000002"), uuid.MustParse("ffffffff-ffff-ffff-ffff-fffffffffffe"))
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	for i := 1; i < len(ids); i++ {
		if !(CompactID(ids[i-1]) < CompactID(ids[i])) {
			t.Fatalf("compact forms out of order: %s (%s) before %s (%s)", ids[i-1], CompactID(ids[i-1]), ids[i], CompactID(ids[i]))
		}
	}
}

// TestDecodeMutationStoredIDs: a Mutation naming its blocks and account by
// their compact ids decodes, on the fast path and through encoding/json,
// to the UUIDs and UUID text of the same Mutation written with text ids.
func TestDecodeMutationStoredIDs(t *testing.T) {
	samples := mutationSamples()
	text, compact := samples[1], samples[3]
	if text == compact || !strings.Contains(compact, CompactID(uuid.MustParse("0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64"))) {
		t.Fatal("the compact sample holds no compact id")
	}
	var want Mutation
	if err := json.Unmarshal([]byte(text), &want); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{compact, strings.Replace(compact, `"idem":"k-1"`, `"idem":"k\u00e9"`, 1)} {
		var fast, slow Mutation
		if err := DecodeMutation([]byte(doc), &fast); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(doc), &slow); err != nil {
			t.Fatal(err)
		}
		for _, got := range []Mutation{fast, slow} {
			got.IdempotencyKey = want.IdempotencyKey
			a, _ := json.Marshal(got)
			b, _ := json.Marshal(want)
			if string(a) != string(b) {
				t.Errorf("decoded\n%s\nwant\n%s", a, b)
			}
		}
	}
	if !MutationFastPath([]byte(compact)) {
		t.Error("a Mutation with compact ids leaves the fast path")
	}
}
