package persist

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/creditd/creditd/engine"
)

// A reservation's operation records live on their ledger entries too
// (issue 26 item 4; docs/decisions.md "Reservations keep no operations row
// (issue 26)"). A reserve writes one zero-delta "reservation" entry, a
// commit one consumption entry (a zero-delta "release" entry at 0 units),
// a release one zero-delta "release" entry, each with ref = the
// reservation id and the metric (lua/reserve.lua, lua/commit.lua,
// lua/release.lua): the entry holds the op, tenant, customer,
// environment, key, instant, reservation id, metric, units, charge and
// overage; the op_head holds what else the replayed answer shows
// (engine's reserveResult, commitResult and release): the account's
// balances and version, the reservation's figures after the operation and
// the request hash. Each head opens with its kind's letter (a consume's
// opens with a digit) and keeps the consume head's fields 3 to 6 (balance,
// reserved, pending, version), so split_part(op_head, '|', 6) is the
// account version of every head (bench/chaos/check.go):
//
//	r|<main>|<balance>|<reserved>|<pending>|<version>|<est units>|<est cost>|<expires ms>|<metadata bytes>|<metadata><request hash>
//	c|<main>|<balance>|<reserved>|<pending>|<version>|<cost>|<est units>|<est cost>|<act units>|<act cost>|<released>|<status>|<request hash>
//	x|<main>|<balance>|<reserved>|<pending>|<version>|<est units>|<est cost>|<released>|<status>|<request hash>
//
// (status one letter, as lua/prelude/reservations.lua codes it). The
// reserve keeps its metadata: a later commit may merge more into the
// reservation's, so the reservations row no longer shows the one the
// reserve answered. The head does not lean on the reservations row at
// all: an extend or a partial commit moves its figures on after the
// operation.
//
// Only a single-metric reserve or commit and a release whose entry and
// head give back exactly the figures its answer shows take this form
// (reservationMain); a multi-metric reserve or commit (its answer lists
// the items) keeps its operations row. What the head leaves out no
// replayed answer reads: the blocks, the request context, the effective
// balance before, lifetime_earned, the account id, the budget section,
// the entries' draws and rates; a commit's expiry, creation instant and
// metadata; a release's settled units and cost.

// Head kinds: the first byte of a reservation's op_head.
const (
	headReserve = 'r'
	headCommit  = 'c'
	headRelease = 'x'
)

// reservationStatusCodes are the one-letter codes of the statuses in a
// head, lua/prelude/reservations.lua's RES_CODE.
var reservationStatusCodes = map[engine.ReservationStatus]byte{
	engine.ReservationActive: 'a', engine.ReservationCommitted: 'c',
	engine.ReservationReleased: 'r', engine.ReservationExpired: 'e',
}

// reservationStatusOf is the status of code c.
func reservationStatusOf(c string) (engine.ReservationStatus, bool) {
	for s, code := range reservationStatusCodes {
		if len(c) == 1 && c[0] == code {
			return s, true
		}
	}
	return "", false
}

// reservationHead is the op_head of m's main entry and that entry's index
// when m is a reserve, commit or release whose replay its ledger entry can
// carry (ok; reservationMain).
func reservationHead(m *engine.Mutation) (head string, main int, ok bool) {
	kind, main, ok := reservationMain(m)
	if !ok {
		return "", 0, false
	}
	r, a := m.Reservation, &m.Account
	b := make([]byte, 0, 128+len(m.RequestHash)+len(r.Metadata))
	b = append(b, kind)
	for _, n := range [...]int64{int64(main), a.Balance, a.Reserved, a.Pending, a.Version} {
		b = strconv.AppendInt(append(b, '|'), n, 10)
	}
	var fields []int64
	switch kind {
	case headReserve:
		fields = []int64{r.EstimatedUnits, r.EstimatedCost, r.ExpiresMS, int64(len(r.Metadata))}
	case headCommit:
		var cost int64
		if m.Usage != nil {
			cost = m.Usage.Cost
		}
		fields = []int64{cost, r.EstimatedUnits, r.EstimatedCost, *r.ActualUnits, *r.ActualCost, r.Released}
	case headRelease:
		fields = []int64{r.EstimatedUnits, r.EstimatedCost, r.Released}
	}
	for _, n := range fields {
		b = strconv.AppendInt(append(b, '|'), n, 10)
	}
	if kind == headReserve {
		b = append(append(append(b, '|'), r.Metadata...), m.RequestHash...)
	} else {
		b = append(append(b, '|', reservationStatusCodes[r.Status], '|'), m.RequestHash...)
	}
	return string(b), main, true
}

// reservationMain is the head kind of m and the index of its main entry
// when m is a keyed reserve or commit of a single-metric reservation, or a
// keyed release, whose entry and head give back every figure its replayed
// answer shows (ok): expiry entries, then one main entry naming the
// reservation and its metric, of the type and figures the kind writes.
func reservationMain(m *engine.Mutation) (kind byte, main int, ok bool) {
	r := m.Reservation
	if m.IdempotencyKey == "" || r == nil || r.Items != nil || len(m.Entries) == 0 || m.Budget != nil && m.Budget.Refused {
		return 0, 0, false
	}
	if _, known := reservationStatusCodes[r.Status]; !known {
		return 0, 0, false
	}
	main = len(m.Entries) - 1
	for i := range m.Entries[:main] {
		if m.Entries[i].Role != engine.RoleExpiry {
			return 0, 0, false
		}
	}
	e := &m.Entries[main]
	metricOK := (r.Metric == "" && e.Metric == nil) || (r.Metric != "" && e.Metric != nil && *e.Metric == r.Metric)
	if e.Role != engine.RoleMain || e.Ref == nil || *e.Ref != r.ID || !metricOK {
		return 0, 0, false
	}
	zero := e.Delta == 0 && e.Units == nil && (e.Overage == nil || *e.Overage == 0)
	switch m.Kind {
	case engine.MutationReserve:
		ok = r.Metric != "" && m.Usage == nil && e.Type == engine.EntryReservation && zero &&
			r.Status == engine.ReservationActive && r.ActualUnits == nil && r.ActualCost == nil && r.Released == 0 &&
			r.CommittedMS == nil && r.ReleasedMS == nil && r.CreatedMS == m.AtMS
		return headReserve, main, ok
	case engine.MutationCommit:
		ok = r.Metric != "" && r.ActualUnits != nil && r.ActualCost != nil && r.ReleasedMS == nil && commitUsageOK(m, e) &&
			((r.Status == engine.ReservationCommitted && r.CommittedMS != nil && *r.CommittedMS == m.AtMS) ||
				(r.Status == engine.ReservationActive && r.CommittedMS == nil))
		return headCommit, main, ok
	case engine.MutationRelease:
		ok = m.Usage == nil && e.Type == engine.EntryRelease && zero && r.CommittedMS == nil &&
			(r.Status == engine.ReservationReleased || r.Status == engine.ReservationExpired) &&
			r.ReleasedMS != nil && *r.ReleasedMS == m.AtMS
		return headRelease, main, ok
	}
	return 0, 0, false
}

// commitUsageOK tells whether commit m's usage is what its main entry e
// and the head rebuild: none for a commit of 0 units (a zero "release"
// entry), else the entry's metric, units, charge and overage, the
// reservation's id, no items and no pool.
func commitUsageOK(m *engine.Mutation, e *engine.MutationEntry) bool {
	u := m.Usage
	if e.Type == engine.EntryRelease {
		return u == nil && e.Delta == 0 && e.Units == nil && (e.Overage == nil || *e.Overage == 0)
	}
	overage := int64(0)
	if e.Overage != nil {
		overage = *e.Overage
	}
	return e.Type == engine.EntryConsumption && u != nil && !u.Refused && u.Items == nil && u.Pool == 0 &&
		u.Metric == m.Reservation.Metric && e.Units != nil && *e.Units == u.Units && u.Charged == -e.Delta &&
		u.Overage == overage && u.ReservationID != nil && *u.ReservationID == m.Reservation.ID
}

// reservationMutation rebuilds the Mutation a replay of a reservation's
// operation answers from (the head's kind letter opens r.head): the
// head's figures and the entry's, the expiry entries before the main one
// standing in as bare expiry entries (so engine.EntryID of the main entry
// is the original one).
func (r *headRow) reservationMutation() (engine.Mutation, error) {
	fail := func(format string, args ...any) (engine.Mutation, error) {
		return engine.Mutation{}, fmt.Errorf("persist: op head of %s: "+format, append([]any{r.op}, args...)...)
	}
	kind := r.head[0]
	var want int // the number fields after the kind
	switch kind {
	case headReserve:
		want = 9
	case headCommit:
		want = 11
	case headRelease:
		want = 8
	default:
		return fail("kind %q", kind)
	}
	// The kind, the numbers, then the rest: the reserve's metadata and
	// request hash, the others' status and request hash.
	f := strings.SplitN(r.head, "|", want+2)
	if len(f) != want+2 || f[0] != string(kind) {
		return fail("%d fields, want %d", len(f), want+2)
	}
	n := make([]int64, want)
	for i := range n {
		var err error
		if n[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return fail("field %d: %w", i+2, err)
		}
	}
	main := n[0]
	if main < 0 || main > engine.MaxLiveBlocks {
		return fail("entry index %d", main)
	}
	if r.ref == nil {
		return fail("its entry names no reservation")
	}
	m := engine.Mutation{OpID: r.op, TenantID: r.tenant, CustomerID: r.customer, Environment: engine.Environment(r.env),
		IdempotencyKey: r.idem, AtMS: r.at.UnixMilli(),
		Account: engine.MutationAccount{Balance: n[1], Reserved: n[2], Pending: n[3], Version: n[4]}}
	res := &engine.MutationReservation{ID: *r.ref}
	if r.metric != nil {
		res.Metric = *r.metric
	}
	m.Reservation = res
	rest := f[want+1]
	at := m.AtMS
	switch kind {
	case headReserve:
		metaBytes := n[8]
		if metaBytes < 0 || metaBytes > int64(len(rest)) {
			return fail("metadata of %d bytes in %d", metaBytes, len(rest))
		}
		m.Kind, m.RequestHash = engine.MutationReserve, rest[metaBytes:]
		res.EstimatedUnits, res.EstimatedCost, res.ExpiresMS = n[5], n[6], n[7]
		res.Status, res.CreatedMS = engine.ReservationActive, at
		if metaBytes > 0 {
			res.Metadata = []byte(rest[:metaBytes])
		}
	case headCommit, headRelease:
		code, rh, found := strings.Cut(rest, "|")
		status, known := reservationStatusOf(code)
		if !found || !known {
			return fail("status %q", code)
		}
		m.RequestHash, res.Status = rh, status
		if kind == headRelease {
			m.Kind = engine.MutationRelease
			res.EstimatedUnits, res.EstimatedCost, res.Released, res.ReleasedMS = n[5], n[6], n[7], &at
			break
		}
		m.Kind = engine.MutationCommit
		units, cost := n[8], n[9]
		res.EstimatedUnits, res.EstimatedCost, res.ActualUnits, res.ActualCost, res.Released = n[6], n[7], &units, &cost, n[10]
		if status == engine.ReservationCommitted {
			res.CommittedMS = &at
		}
		if r.typ == string(engine.EntryConsumption) {
			var entryUnits int64
			if r.units != nil {
				entryUnits = *r.units
			}
			id := *r.ref
			m.Usage = &engine.MutationUsage{Metric: res.Metric, Units: entryUnits, Cost: n[5], Charged: -r.delta,
				Overage: r.overage, ReservationID: &id}
		}
	}
	m.Entries = make([]engine.MutationEntry, main+1)
	for i := range m.Entries[:main] {
		m.Entries[i] = engine.MutationEntry{Role: engine.RoleExpiry, Type: engine.EntryExpiry}
	}
	ref := *r.ref
	e := engine.MutationEntry{Role: engine.RoleMain, Delta: r.delta, Type: engine.EntryType(r.typ), Metric: r.metric,
		Units: r.units, Ref: &ref}
	if r.overage != 0 {
		o := r.overage
		e.Overage = &o
	}
	m.Entries[main] = e
	return m, nil
}
