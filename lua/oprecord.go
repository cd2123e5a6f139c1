package lua

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// opRecordConsume opens the compact op record a consume leaves under its
// idempotency key (prelude/idempotency.lua op_record_consume); a record opening with
// '{' is a whole Mutation (the other scripts, and every op key a rebuild
// writes from Postgres).
const opRecordConsume = 'c'

// decodeConsumeRecord turns a compact consume op record into the Mutation
// a consume answers from, new or replayed: op id, instant, the account figures,
// the usage and the consumption entry at its index (the expiry entries
// before it stand in as bare expiry entries, so engine.EntryID of the
// consumption entry is the original one). It carries no blocks and only
// the request hash prefix; tenant, customer and environment come from the
// caller (fillRecordCustomer).
func decodeConsumeRecord(body string) (engine.Mutation, error) {
	var m engine.Mutation
	head, rest, ok := strings.Cut(body, "\n")
	if !ok || len(head) == 0 || head[0] != opRecordConsume {
		return m, fmt.Errorf("lua: consume op record: no request hash line")
	}
	// Cut field by field into an array: every consume's answer is decoded
	// here, and a Split would allocate the slice.
	var f [11]string
	n := 0
	for more := true; more; n++ {
		if n == len(f) {
			return m, fmt.Errorf("lua: consume op record: more than %d fields", len(f))
		}
		f[n], rest, more = strings.Cut(rest, "|")
	}
	if n != len(f) {
		return m, fmt.Errorf("lua: consume op record: %d fields, want %d", n, len(f))
	}
	op, err := uuid.Parse(f[0])
	if err != nil {
		return m, fmt.Errorf("lua: consume op record: op id: %w", err)
	}
	var v [9]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return m, fmt.Errorf("lua: consume op record: field %d: %w", i+2, err)
		}
	}
	at, idx, units, cost, charged, overage := v[0], v[1], v[2], v[3], v[4], v[5]
	if idx < 0 || idx > engine.MaxLiveBlocks {
		return m, fmt.Errorf("lua: consume op record: entry index %d", idx)
	}
	metric := f[10]
	m = engine.Mutation{OpID: op, Kind: engine.MutationConsume, RequestHash: head[1:], AtMS: at,
		Account: engine.MutationAccount{Balance: v[6], Reserved: v[7], Pending: v[8]},
		Usage:   &engine.MutationUsage{Metric: metric, Units: units, Cost: cost, Charged: charged, Overage: overage}}
	m.Entries = make([]engine.MutationEntry, idx+1)
	for i := range m.Entries[:idx] {
		m.Entries[i] = engine.MutationEntry{Role: engine.RoleExpiry, Type: engine.EntryExpiry}
	}
	main := engine.MutationEntry{Role: engine.RoleMain, Delta: -charged, Type: engine.EntryConsumption,
		Metric: &metric, Units: &units}
	if overage > 0 {
		main.Overage = &overage
	}
	m.Entries[idx] = main
	return m, nil
}

// fillRecordCustomer names the customer of a Mutation decoded from a
// compact op record (which does not repeat what the key name says).
func fillRecordCustomer(res *engine.MutationResult, c engine.CustomerKey, idempotencyKey string) {
	m := &res.Mutation
	if m.CustomerID == uuid.Nil {
		m.TenantID, m.CustomerID, m.Environment, m.IdempotencyKey = c.TenantID, c.CustomerID, c.Environment, idempotencyKey
	}
}
