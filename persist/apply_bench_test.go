package persist

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// BenchmarkApplyConsumes applies consume Mutations (one ledger row with two
// draws, two blocks and the account moved, one credit.consumed event) in
// batches the size of a group commit, through one pooled connection, and
// reports that backend's CPU (pg-µs/op) and WAL (WAL-B/op) per consume
// beside the wall time. Run it with a fixed count, e.g.
// `go test -run '^$' -bench ApplyConsumes -benchtime 8000x ./persist/`;
// figures are reported, never asserted.
func BenchmarkApplyConsumes(b *testing.B) {
	for _, batch := range []int{30, 150, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			url := testenv.Database(b)
			sep := "?"
			if strings.Contains(url, "?") {
				sep = "&"
			}
			pool, err := Open(ctx, url+sep+"pool_max_conns=1")
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			if err := Migrate(ctx, pool); err != nil {
				b.Fatal(err)
			}
			store := NewStore(pool)
			tenant := uuid.New()
			cs := make([]profileCustomer, 2000)
			grants := make([]engine.Mutation, len(cs))
			for i := range cs {
				cs[i] = profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
				grants[i] = cs[i].grant(tenant)
			}
			if err := store.Apply(ctx, grants); err != nil {
				b.Fatal(err)
			}
			ms := make([]engine.Mutation, b.N)
			for i := range ms {
				ms[i] = cs[i%len(cs)].consume(tenant, true)
			}
			before := pgSnapshot(b, pool)
			b.ResetTimer()
			for i := 0; i < len(ms); i += batch {
				if err := store.Apply(ctx, ms[i:min(i+batch, len(ms))]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			d := pgSnapshot(b, pool).minus(before)
			b.ReportMetric(float64(d.cpu.Nanoseconds())/1000/float64(b.N), "pg-µs/op")
			b.ReportMetric(float64(d.wal)/float64(b.N), "WAL-B/op")
		})
	}
}
