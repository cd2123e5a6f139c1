package engine

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"

	"github.com/google/uuid"
)

// TestAppendMutationJSONMatchesMarshal: on the sample documents and on
// Mutations with every optional member set or not and strings that need
// escaping (quotes, control bytes, HTML, non-ASCII, invalid UTF-8),
// AppendMutationJSON writes exactly json.Marshal's bytes, and fails
// exactly when it fails (metadata that is not JSON).
func TestAppendMutationJSONMatchesMarshal(t *testing.T) {
	var ms []Mutation
	for _, doc := range mutationSamples() {
		var m Mutation
		if err := DecodeMutation([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	ms = append(ms, Mutation{})
	rng := rand.New(rand.NewSource(1))
	for range 3000 {
		ms = append(ms, randomMutation(rng))
	}
	failed := 0
	for i := range ms {
		want, werr := json.Marshal(&ms[i])
		if werr != nil {
			failed++
		}
		got, gerr := AppendMutationJSON([]byte("prefix"), &ms[i])
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("mutation %d: AppendMutationJSON err %v, json.Marshal err %v", i, gerr, werr)
		}
		if werr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("mutation %d:\nAppendMutationJSON %s\njson.Marshal             %s", i, got, want)
		}
	}
	if failed == 0 || failed == len(ms) {
		t.Fatalf("%d of %d mutations failed to encode: the generator should make both kinds", failed, len(ms))
	}
}

// randomMutation sets each member of a Mutation or leaves it zero, with
// strings and metadata drawn from texts encoding/json writes as they are
// and texts it escapes or refuses.
func randomMutation(rng *rand.Rand) Mutation {
	texts := []string{"", "consume", "k-1", `q"uote`, `back\slash`, "tab\there", "nul\x00", "<b>&amp;", "é", "\u2028", "bad\xffutf8", "emoji 😀"}
	metas := []json.RawMessage{nil, json.RawMessage(`{}`), json.RawMessage(`{"a": "b <c>"}`), json.RawMessage(`{"n":[1, 2.5,null]}`), json.RawMessage(`{bad`)}
	str := func() string { return texts[rng.Intn(len(texts))] }
	maybe := func() bool { return rng.Intn(2) == 0 }
	num := func() int64 { return rng.Int63n(2_000_000_000) - 1_000_000_000 }
	numPtr := func() *int64 {
		if maybe() {
			return nil
		}
		n := num()
		return &n
	}
	strPtr := func() *string {
		if maybe() {
			return nil
		}
		s := str()
		return &s
	}
	idPtr := func() *uuid.UUID {
		if maybe() {
			return nil
		}
		id := uuid.New()
		return &id
	}
	m := Mutation{OpID: uuid.New(), Kind: MutationKind(str()), TenantID: uuid.New(), CustomerID: uuid.New(),
		Environment: Environment(str()), IdempotencyKey: str(), RequestHash: str(), AtMS: num(),
		Account:         MutationAccount{ID: str(), Version: num(), Balance: num(), Reserved: num(), Pending: num(), LifetimeEarned: num()},
		EffectiveBefore: numPtr(), OutboxMS: num()}
	if maybe() {
		m.Entries = []MutationEntry{}
		for range rng.Intn(3) {
			e := MutationEntry{Role: EntryRole(str()), Delta: num(), Type: EntryType(str()), BlockID: idPtr(),
				Metric: strPtr(), Units: numPtr(), Rate: numPtr(), Ref: idPtr(), Overage: numPtr(), Reason: strPtr(),
				Metadata: metas[rng.Intn(len(metas))]}
			if maybe() {
				src := Source(str())
				e.Source = &src
			}
			if maybe() {
				e.Draws = []EntryDraw{}
				for range rng.Intn(3) {
					e.Draws = append(e.Draws, EntryDraw{BlockID: uuid.New(), Amount: num()})
				}
			}
			m.Entries = append(m.Entries, e)
		}
	}
	if maybe() {
		m.Blocks = []MutationBlock{}
		for range rng.Intn(3) {
			m.Blocks = append(m.Blocks, MutationBlock{ID: uuid.New(), Original: num(), Remaining: num(), Priority: int(num()),
				Source: Source(str()), StartsMS: num(), ExpiresMS: numPtr(), CreatedMS: num(), Metadata: metas[rng.Intn(len(metas))]})
		}
	}
	if maybe() {
		m.Context = &MutationContext{ExternalID: str(), ThresholdMC: num(), Policy: OveragePolicy(str()), Emitter: str()}
		if maybe() {
			m.Context.LimitMC, m.Context.BudgetArg = num(), str()
		}
	}
	if maybe() {
		m.Budget = &MutationBudget{Refused: maybe()}
		for range rng.Intn(3) {
			m.Budget.Reached = append(m.Budget.Reached, BudgetReach{Field: str(), LimitMC: num(), SpentMC: num(), ResetsMS: num()})
		}
	}
	if maybe() {
		m.Usage = &MutationUsage{Metric: str(), Units: num(), Cost: num(), Charged: num(), Overage: num(), Refused: maybe(), ReservationID: idPtr()}
		if maybe() {
			m.Usage.Items = []UsageItem{}
			for range rng.Intn(3) {
				m.Usage.Items = append(m.Usage.Items, UsageItem{Metric: str(), Units: num(), Cost: num()})
			}
		}
	}
	if maybe() {
		m.Reservation = &MutationReservation{Metric: str(), Metadata: metas[rng.Intn(len(metas))]}
	}
	if maybe() {
		m.Gauge = &MutationGauge{}
	}
	return m
}

func BenchmarkEncodeMutation(b *testing.B) {
	var m Mutation
	if err := DecodeMutation([]byte(mutationSamples()[1]), &m); err != nil {
		b.Fatal(err)
	}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for i := 0; i < b.N; i++ {
			var err error
			if buf, err = AppendMutationJSON(buf[:0], &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := json.Marshal(&m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestAppendMutationContextJSONMatchesMarshal: the money scripts' ctx
// argument, written by hand, is exactly json.Marshal's bytes for contexts
// with every optional member set or not, and strings that need escaping.
func TestAppendMutationContextJSONMatchesMarshal(t *testing.T) {
	t.Parallel()
	texts := []string{"", "alice", "k-1", `q"uote`, `back\slash`, "tab\there", "nul\x00", "<b>&amp;", "é", "\u2028", "bad\xffutf8"}
	rng := rand.New(rand.NewSource(2))
	for i := range 2000 {
		str := func() string { return texts[rng.Intn(len(texts))] }
		c := MutationContext{ExternalID: str(), ThresholdMC: rng.Int63n(2000) - 1000, Policy: OveragePolicy(str()),
			BudgetArg: str(), Emitter: str()}
		if rng.Intn(2) == 0 {
			c.LimitMC = rng.Int63() - rng.Int63()
		}
		if rng.Intn(2) == 0 {
			c.Budgets = []Budget{{}}
		}
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendMutationContextJSON([]byte("prefix"), &c); !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("context %d:\nAppendMutationContextJSON %s\njson.Marshal              %s", i, got, want)
		}
	}
}
