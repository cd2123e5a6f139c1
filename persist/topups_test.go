package persist

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// topup adds a topup block of amount, as the grant script writes one.
func (a *account) topup(idem string, amount int64, ref *string, priority int, expires *time.Time) engine.Mutation {
	b := engine.MutationBlock{ID: uuid.New(), Original: amount, Remaining: amount, Source: engine.SourceTopup, Priority: priority,
		StartsMS: a.at.UnixMilli(), CreatedMS: a.at.UnixMilli(), Metadata: json.RawMessage(`{"order":"o-1"}`)}
	if expires != nil {
		ms := expires.UnixMilli()
		b.ExpiresMS = &ms
	}
	a.blocks[b.ID] = &b
	a.balance += amount
	a.earned += amount
	src := engine.SourceTopup
	return a.mutation(engine.MutationGrant, idem, []engine.MutationEntry{{
		Role: engine.RoleMain, Delta: amount, Type: engine.EntryTopup, Source: &src, BlockID: &b.ID, Reason: ref,
		Metadata: json.RawMessage(`{"order":"o-1"}`),
	}}, b)
}

// TestTopupsFromLedger: the topup list is the customer's topup entries,
// newest first, with block priority and expiry; other entries and other
// customers are left out; paging resumes after the cursor.
func TestTopupsFromLedger(t *testing.T) {
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	a, other := newAccount(live, now), newAccount(live, now)
	exp := now.Add(48 * time.Hour)
	ms := []engine.Mutation{
		a.topup("t1", 1000, ptr("pi_1"), 0, nil),
		a.grant("g1", 500, nil),
		a.topup("t2", 2000, nil, 7, &exp),
		a.topup("t3", 3000, ptr("pi_3"), 1, nil),
		other.topup("o1", 9, nil, 0, nil),
	}
	if err := b.store.Apply(b.ctx, ms); err != nil {
		t.Fatal(err)
	}
	p, err := b.store.Topups(b.ctx, a.key, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Data) != 2 || !p.HasMore || p.NextCursor == "" {
		t.Fatalf("first page %+v", p)
	}
	t3, t2 := p.Data[0], p.Data[1]
	if t3.Credits != 3000 || t3.PaymentReference == nil || *t3.PaymentReference != "pi_3" || t3.Priority != 1 || t3.ExpiresAt != nil ||
		t3.ID != engine.EntryID(ms[3].OpID, 0) || t3.IdempotencyKey != "t3" || t3.CustomerID != a.key.CustomerID || string(t3.Metadata["order"]) != `"o-1"` {
		t.Errorf("t3 = %+v", t3)
	}
	if t2.Credits != 2000 || t2.PaymentReference != nil || t2.Priority != 7 || t2.ExpiresAt == nil || !t2.ExpiresAt.Equal(exp) ||
		t2.CreditBlockID == nil || *t2.CreditBlockID != ms[2].Blocks[0].ID {
		t.Errorf("t2 = %+v", t2)
	}
	p, err = b.store.Topups(b.ctx, a.key, p.NextCursor, 2)
	if err != nil || len(p.Data) != 1 || p.HasMore || p.Data[0].Credits != 1000 {
		t.Fatalf("second page %+v, %v", p, err)
	}
	if _, err := b.store.Topups(b.ctx, a.key, "bogus", 2); err == nil {
		t.Error("a bad cursor was accepted")
	}
	if p, err := b.store.Topups(b.ctx, engine.CustomerKey{TenantID: a.key.TenantID, CustomerID: uuid.New()}, "", 20); err != nil || len(p.Data) != 0 || p.Data == nil {
		t.Errorf("no topups: %+v, %v", p, err)
	}
}
