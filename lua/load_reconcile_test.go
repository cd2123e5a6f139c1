package lua

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestStoredAccountsGauges (issue 31 item 5): a reconcile read returns the
// account's gauge counters and active leases as Load writes them
// (leaseFields), for small hashes (HGETALL) and big ones (sliced), so
// reconcile can compare them with Postgres.
func TestStoredAccountsGauges(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		b.grant(t, grantCmd(c, 100, t0))
		l := engine.StoredLease{Metric: "seats", MutationLease: engine.MutationLease{ID: uuid.New(), Amount: 2,
			Status: engine.LeaseActive, ExpiresMS: t0.UnixMilli() + 60_000, CreatedMS: t0.UnixMilli(), Seconds: 60}}
		fields, err := leaseFields([]engine.StoredLease{l})
		if err != nil {
			t.Fatal(err)
		}
		key := b.store.accountKey(c.CustomerID)
		b.rdb.HSet(ctx, key, append(fields, "g:seats", "3", "g:jobs", "0")...)
		for _, big := range []bool{false, true} {
			if big {
				filler := make([]any, 0, 2*reconcileWholeFields)
				for i := range reconcileWholeFields {
					filler = append(filler, fmt.Sprintf("x:%d", i), "1")
				}
				b.rdb.HSet(ctx, key, filler...)
			}
			got, err := b.store.StoredAccounts(ctx, []uuid.UUID{c.CustomerID})
			if err != nil {
				t.Fatal(err)
			}
			st := got[0]
			if len(st.Gauges) != 2 || st.Gauges["seats"] != 3 || st.Gauges["jobs"] != 0 {
				t.Errorf("big=%v: gauges %v, want seats 3 and jobs 0", big, st.Gauges)
			}
			if len(st.Leases) != 1 || st.Leases[0] != l {
				t.Errorf("big=%v: leases %+v, want %+v", big, st.Leases, l)
			}
		}
	})
}
