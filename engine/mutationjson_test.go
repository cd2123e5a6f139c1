package engine

import (
	"encoding/json"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// mutationSamples are documents shaped as the scripts write them (members
// in their order, no white space) and as encoding/json writes them.
func mutationSamples() []string {
	op := `{"op":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f60","kind":"consume","tenant":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f61","customer":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f62","env":"live","idem":"k-1","rh":"4b6e5edbef8dc45c","at":1767225600000,` +
		`"account":{"id":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f63","version":7,"balance":99985,"reserved":0,"pending":0,"lifetime_earned":100000},` +
		`"entries":[{"role":"main","delta":-15,"type":"consumption","source":null,"block":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64","metric":"api_calls","units":5,"meta":{"a":"b","n":[1,2.5,-3e2,true,null]}}],` +
		`"blocks":[{"id":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64","original":100000,"remaining":99985,"priority":0,"source":"manual","starts":1767225540000,"expires":null,"created":1767225540000}],` +
		`"ctx":{"ext":"cust-1","th":500},"eb":100000,"usage":{"metric":"api_calls","units":5,"cost":15,"charged":15,"overage":0}}`
	draws := strings.Replace(op, `"block":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64",`, `"block":null,"draws":[{"b":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64","d":10},{"b":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f65","d":5}],`, 1)
	res := strings.Replace(op, `"eb":100000,`, `"eb":100000,"res":{"id":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f66","metric":"m","est_units":3,"est_cost":9,"released":0,"status":"active","expires":1,"created":0,"meta":{"x":1}},"gauge":{"metric":"seats","current":3},`+
		`"budget":{"reached":[{"field":"u:d:","limit":10,"spent":10,"resets":1767312000000}],"refused":true},`, 1)
	res = strings.Replace(res, `"ctx":{"ext":"cust-1","th":500}`, `"ctx":{"ext":"cust-1","th":500,"lim":5,"bud":"u:d:|1767225600000|1767312000000|10"}`, 1)
	var m Mutation
	_ = json.Unmarshal([]byte(res), &m)
	viaGo, _ := json.Marshal(m)
	// Block and account ids as an account hash keeps them (CompactID).
	compact := draws
	for _, id := range []string{"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f63", "0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f64", "0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f65"} {
		compact = strings.ReplaceAll(compact, `"`+id+`"`, `"`+CompactID(uuid.MustParse(id))+`"`)
	}
	// A committed multi-metric reservation, and a leased gauge move under a
	// cap.
	commit := strings.Replace(op, `"eb":100000,`, `"eb":100000,"res":{"id":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f66","metric":"","est_units":3,"est_cost":9,"act_units":2,"act_cost":6,"released":3,"status":"committed","expires":1,"created":0,"committed":5,"released_at":null,`+
		`"items":[{"billable_metric_key":"a","estimated_units":1,"estimated_cost":3,"actual_units":1,"actual_cost":3},{"billable_metric_key":"b","estimated_units":2,"estimated_cost":6,"actual_units":null,"actual_cost":null}]},`+
		`"gauge":{"metric":"seats","current":3,"cap":10,"leases":[{"id":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f67","amount":2,"status":"active","expires":9,"created":1,"seconds":60}]},`, 1)
	// A grant of a block scoped to metrics names its scope.
	scoped := strings.Replace(op, `"created":1767225540000}]`, `"created":1767225540000,"scope":["api_calls","gpu.seconds"]}]`, 1)
	return []string{op, draws, res, compact, string(viaGo), scoped, `{}`, `{"entries":[],"blocks":[]}`,
		`{"blocks":[{"scope":[]},{"scope":null}]}`, commit}
}

// TestDecodeMutationMatchesEncodingJSON: on the documents the scripts write
// and on every variation of them the generator makes (white space, member
// names in other cases, unknown and repeated members, nulls, escapes,
// non-ASCII, numbers out of range or with fractions, cut short, bytes
// flipped), DecodeMutation gives what json.Unmarshal gives: the same value,
// and an error exactly when json.Unmarshal errs.
func TestDecodeMutationMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	edits := []func(string) string{
		func(s string) string { return s },
		func(s string) string { return strings.ReplaceAll(s, ",", " ,\n\t") },
		func(s string) string { return strings.ReplaceAll(s, ":", " : ") },
		func(s string) string { return strings.Replace(s, `"kind"`, `"KIND"`, 1) },
		func(s string) string { return strings.Replace(s, `"balance"`, `"Balance"`, 1) },
		func(s string) string { return strings.Replace(s, `{"op"`, `{"extra":{"a":[1,{}]},"op"`, 1) },
		func(s string) string { return strings.Replace(s, `"env":"live"`, `"env":"live","env":"test"`, 1) },
		func(s string) string {
			return strings.Replace(s, `"ctx":{"ext":"cust-1",`, `"ctx":{"ext":"cust-1"},"ctx":{`, 1)
		},
		func(s string) string { return strings.Replace(s, `"idem":"k-1"`, `"idem":"k\u00e9\n"`, 1) },
		func(s string) string { return strings.Replace(s, `"idem":"k-1"`, `"idem":"ké"`, 1) },
		func(s string) string { return strings.Replace(s, `"idem":"k-1"`, "\"idem\":\"k\xff\"", 1) },
		func(s string) string { return strings.Replace(s, `"at":1767225600000`, `"at":1.5`, 1) },
		func(s string) string { return strings.Replace(s, `"at":1767225600000`, `"at":1e3`, 1) },
		func(s string) string { return strings.Replace(s, `"at":1767225600000`, `"at":99999999999999999999`, 1) },
		func(s string) string { return strings.Replace(s, `"at":1767225600000`, `"at":-0`, 1) },
		func(s string) string { return strings.Replace(s, `"at":1767225600000`, `"at":007`, 1) },
		func(s string) string { return strings.Replace(s, `"at":1767225600000`, `"at":null`, 1) },
		func(s string) string { return strings.Replace(s, `"eb":100000`, `"eb":null`, 1) },
		func(s string) string { return strings.Replace(s, `"usage":{`, `"usage":null,"usage":{`, 1) },
		func(s string) string { return strings.Replace(s, `"entries":[`, `"entries":null,"entries":[`, 1) },
		func(s string) string { return strings.Replace(s, `"meta":{"a":"b"`, `"meta":null,"x":{"a":"b"`, 1) },
		func(s string) string { return strings.Replace(s, `"meta":{"a":"b"`, `"meta":{"a":"b\q"`, 1) },
		func(s string) string { return strings.Replace(s, `"meta":{"a":"b"`, `"meta":{"a":"b\ud800"`, 1) },
		func(s string) string { return strings.Replace(s, `"expires":null`, `"expires":5`, 1) },
		func(s string) string { return strings.Replace(s, `"block":"0193a0c2`, `"block":"zz93a0c2`, 1) },
		func(s string) string {
			return strings.Replace(s, `"op":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f60"`, `"op":""`, 1)
		},
		func(s string) string {
			return strings.Replace(s, `"op":"0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f60"`, `"op":"{0193a0c2-7d4e-7a31-9a55-1b2c3d4e5f60}"`, 1)
		},
		func(s string) string { return strings.Replace(s, `"units":5,"cost"`, `"units":"5","cost"`, 1) },
		func(s string) string { return strings.Replace(s, `"current":3`, `"current":3.5`, 1) },
		func(s string) string { return strings.Replace(s, `"res":{`, `"res":null,"res":{`, 1) },
		func(s string) string { return strings.Replace(s, `"res":{`, `"res":{"items":null,`, 1) },
		func(s string) string {
			return strings.Replace(s, `"res":{`, `"res":{"items":[{"billable_metric_key":"z"}],`, 1)
		},
		func(s string) string { return strings.Replace(s, `"res":{`, `"res":{"items":[],`, 1) },
		func(s string) string { return strings.Replace(s, `"status":"active"`, `"status":"Active"`, 1) },
		func(s string) string { return strings.Replace(s, `"act_units":2`, `"act_units":null`, 1) },
		func(s string) string { return strings.Replace(s, `"gauge":{`, `"gauge":null,"gauge":{"cap":1,`, 1) },
		func(s string) string { return strings.Replace(s, `"leases":[`, `"leases":null,"leases":[`, 1) },
		func(s string) string { return strings.Replace(s, `"cap":10`, `"cap":null`, 1) },
		func(s string) string { return strings.Replace(s, `"charged":15`, `"charged":15,"refused":true`, 1) },
		func(s string) string { return s + " " },
		func(s string) string { return s + " x" },
		func(s string) string { return s + "{}" },
		func(s string) string { return "null" },
		func(s string) string { return "[]" },
		func(s string) string {
			if len(s) < 2 {
				return s
			}
			return s[:rng.Intn(len(s))]
		},
		func(s string) string {
			if len(s) == 0 {
				return s
			}
			b := []byte(s)
			const flips = "{}[],:\"\\0-a \x00"
			b[rng.Intn(len(b))] = flips[rng.Intn(len(flips))]
			return string(b)
		},
	}
	n := 0
	for _, base := range mutationSamples() {
		for i, edit := range edits {
			reps := 1
			if i >= len(edits)-2 {
				reps = 300
			}
			for r := 0; r < reps; r++ {
				doc := edit(base)
				compareDecoders(t, doc)
				n++
			}
		}
	}
	t.Logf("%d documents compared", n)
}

func compareDecoders(t *testing.T, doc string) {
	t.Helper()
	var fast, slow Mutation
	ferr := DecodeMutation([]byte(doc), &fast)
	serr := json.Unmarshal([]byte(doc), &slow)
	if (ferr == nil) != (serr == nil) {
		t.Fatalf("%q: DecodeMutation err %v, json.Unmarshal err %v", doc, ferr, serr)
	}
	if serr == nil && !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%q:\nDecodeMutation %+v\njson.Unmarshal %+v", doc, fast, slow)
	}
	var fromString Mutation
	if err := DecodeMutationString(doc, &fromString); (err == nil) != (ferr == nil) || !reflect.DeepEqual(fromString, fast) {
		t.Fatalf("%q:\nDecodeMutationString %+v, %v\nDecodeMutation       %+v, %v", doc, fromString, err, fast, ferr)
	}
}

// TestDecodeMutationFastPath: the scripts' documents take the fast path
// (a slow path that caught everything would pass the test above too).
func TestDecodeMutationFastPath(t *testing.T) {
	for _, doc := range mutationSamples() {
		var m Mutation
		d := mutationDecoder{b: []byte(doc)}
		if err := d.mutation(&m); err != nil {
			t.Errorf("%.60q...: fast path refused it: %v", doc, err)
		}
	}
	var m Mutation
	if err := DecodeMutation([]byte(mutationSamples()[0]), &m); err != nil || m.Usage == nil || m.Usage.Charged != 15 || m.Account.Balance != 99985 || m.Entries[0].Metadata == nil || m.OpID == uuid.Nil {
		t.Fatalf("decoded %+v, %v", m, err)
	}
}

// FuzzDecodeMutation holds the two decoders to each other on any input
// (go test runs the seeds; go test -fuzz=FuzzDecodeMutation explores).
func FuzzDecodeMutation(f *testing.F) {
	for _, s := range mutationSamples() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) { compareDecoders(t, doc) })
}

func BenchmarkDecodeMutation(b *testing.B) {
	doc := []byte(mutationSamples()[0])
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			var m Mutation
			if err := DecodeMutation(doc, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			var m Mutation
			if err := json.Unmarshal(doc, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
