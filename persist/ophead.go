package persist

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// A consume's operation record lives on its ledger entry (migration 023,
// issue 26 item 4). The entry row holds most of what a replayed answer is
// built from (engine.consumeResult: the op, tenant, customer, environment,
// key, metric, units, charge, overage and instant); op_head holds the rest,
// as text:
//
//	<main entry index>|<cost>|<balance>|<reserved>|<pending>|<version>|<request hash>
//
// (the hash last: it is the one field that may hold a '|'). A consume
// stores no operations row then, so Postgres keeps about 100 bytes for its
// replays instead of the whole Mutation text. What the head leaves out
// (the blocks' states, the request context, the effective balance before,
// lifetime_earned and the account id) no replayed answer reads: the blocks
// and the account are in credit_blocks and credit_accounts, and the events
// the context fed are stored.
//
// Only a consume whose entry and head give back exactly the figures its
// answer shows takes this form (leanHead). A reservation's reserve, commit
// and release take a form of their own on their ledger entry, their head
// opening with a letter (ophead_reservation.go, docs/decisions.md
// "Reservations keep no operations row (issue 26)"). Any other Mutation
// with a key (grants, debits, extends, gauges, refusals, multi-metric
// consumes, reserves and commits) keeps its operations row.

// leanHead is the op_head of m's main entry and that entry's index, when
// m is a consume, or a reservation's reserve, commit or release
// (reservationHead), whose replay its ledger entry can carry (ok).
func leanHead(m *engine.Mutation) (head string, main int, ok bool) {
	switch m.Kind {
	case engine.MutationReserve, engine.MutationCommit, engine.MutationRelease:
		return reservationHead(m)
	}
	if main, ok = leanMain(m); !ok {
		return "", 0, false
	}
	u := m.Usage
	a := &m.Account
	b := make([]byte, 0, 48+len(m.RequestHash))
	b = strconv.AppendInt(b, int64(main), 10)
	for _, n := range [...]int64{u.Cost, a.Balance, a.Reserved, a.Pending, a.Version} {
		b = strconv.AppendInt(append(b, '|'), n, 10)
	}
	b = append(append(b, '|'), m.RequestHash...)
	return string(b), main, true
}

// leanMain is the index of m's main entry when m is a consume whose
// replay its ledger entry can carry (ok): leanHead's test.
func leanMain(m *engine.Mutation) (main int, ok bool) {
	u := m.Usage
	if m.IdempotencyKey == "" || m.Kind != engine.MutationConsume || u == nil || u.Refused ||
		u.Items != nil || u.ReservationID != nil || len(m.Entries) == 0 {
		return 0, false
	}
	main = len(m.Entries) - 1
	for i := range m.Entries[:main] {
		if m.Entries[i].Role != engine.RoleExpiry {
			return 0, false
		}
	}
	e := &m.Entries[main]
	overage := int64(0)
	if e.Overage != nil {
		overage = *e.Overage
	}
	if e.Role != engine.RoleMain || e.Type != engine.EntryConsumption || e.Metric == nil || *e.Metric != u.Metric ||
		e.Units == nil || *e.Units != u.Units || e.Delta != -u.Charged || overage != u.Overage {
		return 0, false
	}
	return main, true
}

// headRow is a ledger entry carrying an op_head, as AppliedOps reads it.
type headRow struct {
	op, tenant, customer uuid.UUID
	env, idem, head, typ string
	delta, overage       int64
	metric               *string
	units                *int64
	ref                  *uuid.UUID
	at                   time.Time
}

// headColumns are the columns of ledger_entries scanned into a headRow
// (scan), in its order.
const headColumns = `op_id, tenant_id, customer_id, environment, idempotency_key, op_head, delta, overage_mc,
	billable_metric_key, cost_units, created_at, type, reference_id`

// scan is the destination list of headColumns.
func (r *headRow) scan() []any {
	return []any{&r.op, &r.tenant, &r.customer, &r.env, &r.idem, &r.head, &r.delta, &r.overage, &r.metric, &r.units, &r.at,
		&r.typ, &r.ref}
}

// mutation rebuilds the Mutation a replay answers from: leanHead's
// figures and the entry's, the expiry entries before the main one standing
// in as bare expiry entries (so engine.EntryID of the main entry is the
// original one), no blocks and no request context.
func (r *headRow) mutation() (engine.Mutation, error) {
	if r.head != "" && (r.head[0] < '0' || r.head[0] > '9') {
		return r.reservationMutation()
	}
	f := strings.SplitN(r.head, "|", 7)
	if len(f) != 7 {
		return engine.Mutation{}, fmt.Errorf("persist: op head of %s: %d fields, want 7", r.op, len(f))
	}
	var n [6]int64
	for i := range n {
		var err error
		if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return engine.Mutation{}, fmt.Errorf("persist: op head of %s: field %d: %w", r.op, i+1, err)
		}
	}
	main, cost := n[0], n[1]
	if main < 0 || main > engine.MaxLiveBlocks {
		return engine.Mutation{}, fmt.Errorf("persist: op head of %s: entry index %d", r.op, main)
	}
	var metric string
	var units int64
	if r.metric != nil {
		metric = *r.metric
	}
	if r.units != nil {
		units = *r.units
	}
	m := engine.Mutation{OpID: r.op, Kind: engine.MutationConsume, TenantID: r.tenant, CustomerID: r.customer,
		Environment: engine.Environment(r.env), IdempotencyKey: r.idem, RequestHash: f[6], AtMS: r.at.UnixMilli(),
		Account: engine.MutationAccount{Balance: n[2], Reserved: n[3], Pending: n[4], Version: n[5]},
		Usage:   &engine.MutationUsage{Metric: metric, Units: units, Cost: cost, Charged: -r.delta, Overage: r.overage}}
	m.Entries = make([]engine.MutationEntry, main+1)
	for i := range m.Entries[:main] {
		m.Entries[i] = engine.MutationEntry{Role: engine.RoleExpiry, Type: engine.EntryExpiry}
	}
	e := engine.MutationEntry{Role: engine.RoleMain, Delta: r.delta, Type: engine.EntryConsumption,
		Metric: r.metric, Units: r.units}
	if r.overage != 0 {
		o := r.overage
		e.Overage = &o
	}
	m.Entries[main] = e
	return m, nil
}

// headLookupSQL finds the ledger entry carrying the op head of tenant $1's
// key $2 through ledger_entries_op_key_idx (an 8-byte hash per lean
// consume; the tenant and key are compared on the row).
const headLookupSQL = `SELECT ` + headColumns + ` FROM ledger_entries
	WHERE hashtextextended($1::uuid::text || $2::text, 0) = hashtextextended(tenant_id::text || idempotency_key, 0)
		AND op_head IS NOT NULL AND tenant_id = $1 AND idempotency_key = $2`
