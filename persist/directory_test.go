package persist

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

func newCustomer(s engine.Scope, ext string, at time.Time) engine.Customer {
	return engine.Customer{ID: uuid.New(), TenantID: s.TenantID, Environment: s.Environment, ExternalID: ext,
		Metadata: engine.Metadata{}, CreatedAt: at, UpdatedAt: at}
}

func TestTenantRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	got, err := b.store.GetTenant(b.ctx, live.TenantID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "acme" || got.DefaultOveragePolicy != engine.OveragePolicyBlock || got.RateLimitBurst != 2000 {
		t.Fatalf("tenant = %+v", got)
	}
	got.WebhookURL, got.WebhookSecret = ptr("https://example.com/h"), ptr("whsec_x")
	got.DefaultLowBalanceThresholdMC = 500
	if err := b.store.UpdateTenant(b.ctx, got); err != nil {
		t.Fatal(err)
	}
	again, err := b.store.GetTenant(b.ctx, live.TenantID)
	if err != nil {
		t.Fatal(err)
	}
	if *again.WebhookURL != "https://example.com/h" || *again.WebhookSecret != "whsec_x" || again.DefaultLowBalanceThresholdMC != 500 {
		t.Fatalf("updated tenant = %+v", again)
	}
	if _, err := b.store.GetTenant(b.ctx, uuid.New()); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
	if err := b.store.UpdateTenant(b.ctx, engine.Tenant{ID: uuid.New(), DefaultOveragePolicy: "block", RateLimitPerSecond: 1, RateLimitBurst: 1}); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("update unknown tenant: %v", err)
	}
}

func TestAPIKeyHashAndRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	hash := sha256.Sum256([]byte("ck_live_abc"))
	key := engine.APIKey{ID: uuid.New(), TenantID: live.TenantID, Environment: engine.EnvironmentLive, Key: "ck_live_abc", CreatedAt: now}
	if err := b.store.CreateAPIKey(b.ctx, key, hash[:]); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.APIKeyByHash(b.ctx, hash[:])
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != key.ID || got.TenantID != live.TenantID || got.Environment != engine.EnvironmentLive || got.Key != "" {
		t.Fatalf("key = %+v", got)
	}
	other := sha256.Sum256([]byte("ck_live_other"))
	tests := []struct {
		name string
		run  func() error
	}{
		{"unknown hash", func() error { _, err := b.store.APIKeyByHash(b.ctx, other[:]); return err }},
		{"revoke other tenant's key", func() error { return b.store.RevokeAPIKey(b.ctx, uuid.New(), key.ID, now) }},
	}
	for _, tc := range tests {
		if err := tc.run(); !errors.Is(err, engine.ErrNotFound) {
			t.Fatalf("%s: err = %v, want ErrNotFound", tc.name, err)
		}
	}
	if err := b.store.RevokeAPIKey(b.ctx, live.TenantID, key.ID, now); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.APIKeyByHash(b.ctx, hash[:]); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("revoked key still found: %v", err)
	}
	if err := b.store.RevokeAPIKey(b.ctx, live.TenantID, key.ID, now); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
}

func TestCustomerCRUD(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	otherLive, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)

	c := newCustomer(live, "user_1", now)
	c.DisplayName = ptr("Ada")
	c.OveragePolicy = ptr(engine.OveragePolicyNotify)
	c.LowBalanceThresholdMC = ptr(int64(1000))
	c.Metadata = engine.Metadata{"plan": json.RawMessage(`"pro"`), "n": json.RawMessage(`12345678901234567`)}
	if err := b.store.CreateCustomer(b.ctx, c); err != nil {
		t.Fatal(err)
	}

	// external_id is unique per tenant and environment among live customers.
	uniq := []struct {
		name string
		c    engine.Customer
		want error
	}{
		{"same scope", newCustomer(live, "user_1", now), engine.ErrExternalIDTaken},
		{"sandbox shares it", newCustomer(sandbox, "user_1", now), nil},
		{"other tenant shares it", newCustomer(otherLive, "user_1", now), nil},
	}
	for _, tc := range uniq {
		if err := b.store.CreateCustomer(b.ctx, tc.c); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Fatalf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}

	got, err := b.store.CustomerByExternalID(b.ctx, live, "user_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != c.ID || *got.DisplayName != "Ada" || *got.OveragePolicy != engine.OveragePolicyNotify ||
		*got.LowBalanceThresholdMC != 1000 || string(got.Metadata["n"]) != "12345678901234567" || !got.CreatedAt.Equal(now) {
		t.Fatalf("by external id = %+v", got)
	}
	byID, err := b.store.CustomerByID(b.ctx, c.ID)
	if err != nil || byID.TenantID != live.TenantID {
		t.Fatalf("by id = %+v, %v", byID, err)
	}

	got.DisplayName, got.OveragePolicy, got.LowBalanceThresholdMC = nil, nil, nil
	got.Metadata["extra"] = json.RawMessage(`true`)
	got.UpdatedAt = now.Add(time.Second)
	if err := b.store.UpdateCustomer(b.ctx, got); err != nil {
		t.Fatal(err)
	}
	upd, _ := b.store.CustomerByID(b.ctx, c.ID)
	if upd.DisplayName != nil || upd.OveragePolicy != nil || upd.LowBalanceThresholdMC != nil || len(upd.Metadata) != 3 || !upd.UpdatedAt.Equal(now.Add(time.Second)) {
		t.Fatalf("after update = %+v", upd)
	}

	// Delete only in its own scope, once; a re-created customer is new.
	if err := b.store.DeleteCustomer(b.ctx, sandbox, c.ID, now); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("delete from other env: %v", err)
	}
	if err := b.store.DeleteCustomer(b.ctx, live, c.ID, now); err != nil {
		t.Fatal(err)
	}
	missing := []struct {
		name string
		run  func() error
	}{
		{"second delete", func() error { return b.store.DeleteCustomer(b.ctx, live, c.ID, now) }},
		{"by id", func() error { _, err := b.store.CustomerByID(b.ctx, c.ID); return err }},
		{"by external id", func() error { _, err := b.store.CustomerByExternalID(b.ctx, live, "user_1"); return err }},
		{"update", func() error { return b.store.UpdateCustomer(b.ctx, got) }},
		{"unknown id", func() error { _, err := b.store.CustomerByID(b.ctx, uuid.New()); return err }},
	}
	for _, tc := range missing {
		if err := tc.run(); !errors.Is(err, engine.ErrNotFound) {
			t.Fatalf("%s: err = %v, want ErrNotFound", tc.name, err)
		}
	}
	again := newCustomer(live, "user_1", now)
	if err := b.store.CreateCustomer(b.ctx, again); err != nil {
		t.Fatalf("re-create after delete: %v", err)
	}
	found, err := b.store.CustomerByExternalID(b.ctx, live, "user_1")
	if err != nil || found.ID != again.ID || found.ID == c.ID {
		t.Fatalf("re-created = %v, %v", found.ID, err)
	}
}

func TestListCustomersSearchAndPaging(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	base := time.Now().UTC().Truncate(time.Millisecond)
	want := map[uuid.UUID]bool{}
	for i := range 7 {
		c := newCustomer(live, fmt.Sprintf("acct_%d", i), base.Add(time.Duration(i/2)*time.Second)) // ties on created_at
		if i == 3 {
			c.DisplayName = ptr("100% Real_Name")
		}
		if err := b.store.CreateCustomer(b.ctx, c); err != nil {
			t.Fatal(err)
		}
		want[c.ID] = true
	}
	if err := b.store.CreateCustomer(b.ctx, newCustomer(sandbox, "acct_sandbox", base)); err != nil {
		t.Fatal(err)
	}
	deleted := newCustomer(live, "acct_deleted", base)
	if err := b.store.CreateCustomer(b.ctx, deleted); err != nil {
		t.Fatal(err)
	}
	if err := b.store.DeleteCustomer(b.ctx, live, deleted.ID, base); err != nil {
		t.Fatal(err)
	}

	// Three pages of 3, 3, 1: newest first, no duplicates, nothing missing.
	var seen []engine.Customer
	cursor := ""
	for page := 0; ; page++ {
		p, err := b.store.ListCustomers(b.ctx, live, "", cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, p.Data...)
		if !p.HasMore {
			if page != 2 || len(p.Data) != 1 || p.NextCursor != "" {
				t.Fatalf("last page %d has %d rows, cursor %q", page, len(p.Data), p.NextCursor)
			}
			break
		}
		cursor = p.NextCursor
	}
	if len(seen) != len(want) {
		t.Fatalf("listed %d customers, want %d", len(seen), len(want))
	}
	for i, c := range seen {
		if !want[c.ID] {
			t.Fatalf("unexpected or duplicate customer %s", c.ExternalID)
		}
		delete(want, c.ID)
		if i > 0 {
			prev := seen[i-1]
			if c.CreatedAt.After(prev.CreatedAt) || (c.CreatedAt.Equal(prev.CreatedAt) && c.ID.String() > prev.ID.String()) {
				t.Fatalf("not newest first at %d", i)
			}
		}
	}

	search := []struct {
		q    string
		want int
	}{
		{"ACCT_", 7},
		{"acct_3", 1},
		{"100%", 1},
		{"real_name", 1},
		{"%", 1},
		{"_", 7},
		{"sandbox", 0},
		{"deleted", 0},
		{"nomatch", 0},
	}
	for _, tc := range search {
		p, err := b.store.ListCustomers(b.ctx, live, tc.q, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Data) != tc.want || p.HasMore || p.Data == nil {
			t.Fatalf("search %q: %d rows (has_more %v), want %d", tc.q, len(p.Data), p.HasMore, tc.want)
		}
	}

	for _, bad := range []string{"x", "!!!", "AQID", encodeCursor(pageKey{})[1:]} {
		_, err := b.store.ListCustomers(b.ctx, live, "", bad, 3)
		if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindBadRequest || e.Field != "cursor" {
			t.Fatalf("cursor %q: err = %v, want bad-request on cursor", bad, err)
		}
	}
}
