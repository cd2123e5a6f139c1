package persist

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
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
			pool := profilePool(ctx, b, "")
			store := NewStore(pool)
			tenant, cs := seedProfileCustomers(ctx, b, store, 2000)
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

// BenchmarkCopySteps is the Go side of a lean write with no database: the
// columns, events and statements copySteps prepares for a group of 150
// consumes (one entry with two draws, two blocks, one credit.consumed
// event), per consume. It is what creditd's persister spends per consume
// before the rows are encoded for Postgres.
func BenchmarkCopySteps(b *testing.B) {
	const batch = 150
	tenant := uuid.New()
	cs := make([]profileCustomer, batch)
	for i := range cs {
		cs[i] = profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
	}
	ms := make([]engine.Mutation, batch)
	for i := range ms {
		ms[i] = cs[i].consume(tenant, true)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		steps, err := copySteps(ms, nil, shapeLean)
		if err != nil || len(steps) == 0 {
			b.Fatal(steps, err)
		}
	}
}
