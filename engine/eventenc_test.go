package engine

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestAppendEnvelopeJSON: on envelopes with every member set or not, each
// kind of data, strings that need escaping and times in and out of RFC
// 3339's years, appendEnvelopeJSON writes exactly json.Marshal's bytes.
func TestAppendEnvelopeJSON(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	texts := []string{"", "credit.consumed", "k-1", `q"uote`, "tab\there", "<b>&", "é", "\u2029", "bad\xffutf8"}
	str := func() string { return texts[rng.Intn(len(texts))] }
	maybe := func() bool { return rng.Intn(2) == 0 }
	num := func() int64 { return rng.Int63n(2_000_000_000) - 1_000_000_000 }
	times := []time.Time{time.UnixMilli(1767225600123).UTC(), time.Unix(1767225600, 0).UTC(), time.Unix(0, 1).UTC(),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()}
	fast := 0
	for i := range 3000 {
		env := Envelope{EventID: uuid.New(), EventType: EventType(str()), TenantID: uuid.New(), Environment: Environment(str()),
			CreatedAt: times[rng.Intn(len(times))], IdempotencyKey: str()}
		if maybe() {
			id := uuid.New()
			env.CustomerID = &id
		}
		if maybe() {
			s := str()
			env.ExternalCustomerID = &s
		}
		if maybe() {
			n := num()
			env.Version = &n
		}
		if rng.Intn(10) == 0 {
			n := num()
			env.Sequence = &n
		}
		d := ConsumedData{TransactionID: uuid.New(), Credits: num(), OverageMC: num(), BalanceAfter: num()}
		if maybe() {
			s, n := str(), num()
			d.BillableMetricKey, d.Units = &s, &n
		}
		if maybe() {
			id := uuid.New()
			d.ReservationID = &id
		}
		if maybe() {
			d.Items = []ItemCost{}
			for range rng.Intn(3) {
				d.Items = append(d.Items, ItemCost{BillableMetricKey: str(), Units: num(), Cost: num()})
			}
		}
		switch rng.Intn(3) {
		case 0:
			env.Data = d
		case 1:
			env.Data = LowBalanceData{BalanceMC: num(), ThresholdMC: num()}
		default:
			env.Data = ExhaustedData{BalanceMC: num()}
		}
		want, werr := json.Marshal(env)
		got, gerr := appendEnvelopeJSON([]byte("x"), &env)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("envelope %d: appendEnvelopeJSON err %v, json.Marshal err %v", i, gerr, werr)
		}
		if werr == nil && !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Fatalf("envelope %d:\nappendEnvelopeJSON %s\njson.Marshal       %s", i, got, want)
		}
		if _, ok := env.Data.(ConsumedData); ok && werr == nil {
			fast++
		}
	}
	if fast == 0 {
		t.Fatal("no credit.consumed envelope was compared")
	}
}
