package engine

import (
	"crypto/sha1"
	"encoding/json"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// MutationKind names the operation that produced a Mutation.
type MutationKind string

// Mutation kinds written by the Lua scripts.
const (
	MutationGrant  MutationKind = "grant"
	MutationDebit  MutationKind = "debit"
	MutationExpire MutationKind = "expire"
	// MutationConsume charges priced usage (or records a refusal).
	MutationConsume MutationKind = "consume"
	// Reservation kinds.
	MutationReserve MutationKind = "reserve"
	MutationCommit  MutationKind = "commit"
	MutationRelease MutationKind = "release"
	// MutationGaugeKind moves a gauge counter; it has no ledger entries.
	MutationGaugeKind MutationKind = "gauge"
)

// EntryRole separates the entries an operation asked for from the expiry
// entries a script wrote on the way (blocks that ran out before it).
type EntryRole string

// Entry roles.
const (
	RoleMain   EntryRole = "main"
	RoleExpiry EntryRole = "expiry"
)

// Mutation is one atomic change of one customer's credit state. A Lua script
// produces it, appends it to the customer's outbox partition in the same
// script, and returns it; the persister writes it to Postgres keyed by OpID
// and entry ids, so a replay inserts nothing twice. Its JSON form (the tags
// below) is the outbox wire format; docs/design.md describes it.
type Mutation struct {
	OpID           uuid.UUID    `json:"op"`
	Kind           MutationKind `json:"kind"`
	TenantID       uuid.UUID    `json:"tenant"`
	CustomerID     uuid.UUID    `json:"customer"`
	Environment    Environment  `json:"env"`
	IdempotencyKey string       `json:"idem"`
	// RequestHash fingerprints the request body, so a reused key with another
	// body is told apart from a retry even after the HTTP replay cache is gone.
	RequestHash string          `json:"rh"`
	AtMS        int64           `json:"at"`
	Account     MutationAccount `json:"account"`
	Entries     []MutationEntry `json:"entries"`
	Blocks      []MutationBlock `json:"blocks"`
	// Context is what Go told the script about the request (spliced as is).
	Context *MutationContext `json:"ctx,omitempty"`
	// EffectiveBefore is the effective balance before the change, so event
	// crossings (low balance, exhausted) can be derived from the Mutation.
	EffectiveBefore *int64               `json:"eb,omitempty"`
	Usage           *MutationUsage       `json:"usage,omitempty"`
	Reservation     *MutationReservation `json:"res,omitempty"`
	Gauge           *MutationGauge       `json:"gauge,omitempty"`
	// Budget is what the charge did to the customer's budgets: the ones it
	// brought to their limit, or the one that refused it (lua/prelude/budgets.lua
	// budget_take); nil when it reached none.
	Budget *MutationBudget `json:"budget,omitempty"`
	// OutboxMS is the millisecond part of the outbox entry's stream id
	// (Redis' clock at XADD), set by the persister from the entry it read;
	// 0 when unknown. It is not part of the wire format.
	OutboxMS int64 `json:"-"`
	// OutboxPartition and OutboxLease are the entry's outbox partition and
	// the fencing token of the persister's lease on it (OutboxLeases), set
	// by a persister that holds one; OutboxLease 0 when it holds none. Not
	// part of the wire format.
	OutboxPartition int   `json:"-"`
	OutboxLease     int64 `json:"-"`
}

// MutationAccount is the account as it stands after a mutation.
type MutationAccount struct {
	ID             string `json:"id"`
	Version        int64  `json:"version"`
	Balance        int64  `json:"balance"`
	Reserved       int64  `json:"reserved"`
	Pending        int64  `json:"pending"`
	LifetimeEarned int64  `json:"lifetime_earned"`
	// Debt is what the account owes on its credit line (>= 0), counted in
	// Balance: Balance = the live blocks' credit - Debt.
	Debt int64 `json:"debt,omitempty"`
}

// MutationEntry is one ledger entry of a mutation; its id is derived from the
// mutation's OpID and its index (EntryID), so every reader agrees on it.
type MutationEntry struct {
	Role    EntryRole  `json:"role"`
	Delta   int64      `json:"delta"`
	Type    EntryType  `json:"type"`
	Source  *Source    `json:"source"`
	BlockID *uuid.UUID `json:"block"`
	Metric  *string    `json:"metric,omitempty"`
	Units   *int64     `json:"units,omitempty"`
	Rate    *int64     `json:"rate,omitempty"`
	Ref     *uuid.UUID `json:"ref,omitempty"`
	// Overage is what a consume could not charge under allow/notify.
	Overage  *int64          `json:"overage,omitempty"`
	Reason   *string         `json:"reason,omitempty"`
	Metadata json.RawMessage `json:"meta,omitempty"`
	// Draws says what each block paid when one entry drained several (a
	// consume, a commit and a usage event write one debit: docs/spec/interface.md);
	// BlockID is then nil. Entries that drain one block leave it empty.
	Draws []EntryDraw `json:"draws,omitempty"`
}

// PaidBy is the entry's block when one block paid (BlockID, or its single
// draw), else nil and the draws of the several blocks that paid: the form
// the ledger stores and history shows, whichever way a script wrote it.
func (e *MutationEntry) PaidBy() (*uuid.UUID, []EntryDraw) {
	switch {
	case len(e.Draws) > 1:
		return e.BlockID, e.Draws
	case len(e.Draws) == 1 && e.Draws[0].Amount != -e.Delta:
		// The block paid less than the delta (the rest went on the credit
		// line) or paid a debt (debt_repayment): the draw says how much.
		return nil, e.Draws
	case len(e.Draws) == 1 && e.BlockID == nil:
		id := e.Draws[0].BlockID
		return &id, nil
	}
	return e.BlockID, nil
}

// EntryDraw is what one block paid towards a ledger entry.
type EntryDraw struct {
	BlockID uuid.UUID `json:"b"`
	// Amount is the positive amount the block paid.
	Amount int64 `json:"d"`
}

// MutationBlock is the full state of a block a mutation created or changed.
type MutationBlock struct {
	ID        uuid.UUID       `json:"id"`
	Original  int64           `json:"original"`
	Remaining int64           `json:"remaining"`
	Priority  int             `json:"priority"`
	Source    Source          `json:"source"`
	StartsMS  int64           `json:"starts"`
	ExpiresMS *int64          `json:"expires"`
	CreatedMS int64           `json:"created"`
	Metadata  json.RawMessage `json:"meta,omitempty"`
	// Scope is the metric keys the block pays for, sorted (nil: every
	// metric; docs/rules.md "Credits scoped to metrics"). Only the
	// Mutation creating a block names it: it never changes.
	Scope []string `json:"scope,omitempty"`
}

// entryNamespace seeds EntryID; changing it would re-key every ledger entry.
var entryNamespace = uuid.MustParse("6f1c3f52-8a47-4b7e-9d56-0c1e2a9f4b10")

// EntryID is the id of entry i of operation op: a name-based UUID, so the
// API response, the persister and a replay all derive the same id. It is
// uuid.NewSHA1(entryNamespace, op bytes + decimal i) computed on the stack
// (NewSHA1 allocates its hash and input): the consume response and the
// persister name an entry on every call.
func EntryID(op uuid.UUID, i int) uuid.UUID {
	var in [16 + 16 + 20]byte
	b := append(append(in[:0], entryNamespace[:]...), op[:]...)
	return nameUUID(strconv.AppendInt(b, int64(i), 10))
}

// nameUUID is the version 5 UUID of b, a namespace's 16 bytes and then the
// name: uuid.NewSHA1's answer without its allocations.
func nameUUID(b []byte) uuid.UUID {
	sum := sha1.Sum(b)
	var u uuid.UUID
	copy(u[:], sum[:16])
	u[6] = (u[6] & 0x0f) | 0x50 // version 5
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 4122 variant
	return u
}

// At is the mutation's instant.
func (m *Mutation) At() time.Time { return time.UnixMilli(m.AtMS).UTC() }

// LedgerEntries turns the mutation's entries into ledger rows, all of them
// when role is empty, else only those of that role.
func (m *Mutation) LedgerEntries(role EntryRole) []LedgerEntry {
	out := make([]LedgerEntry, 0, len(m.Entries))
	for i, e := range m.Entries {
		if role != "" && e.Role != role {
			continue
		}
		out = append(out, m.ledgerEntry(i, e))
	}
	return out
}

func (m *Mutation) ledgerEntry(i int, e MutationEntry) LedgerEntry {
	meta := Metadata{}
	if len(e.Metadata) > 0 {
		_ = json.Unmarshal(e.Metadata, &meta)
	}
	block, paid := e.PaidBy()
	var draws []LedgerDraw
	if len(paid) > 0 {
		draws = make([]LedgerDraw, len(paid))
		for j, d := range paid {
			draws[j] = LedgerDraw{CreditBlockID: d.BlockID, Amount: d.Amount}
		}
	}
	return LedgerEntry{
		ID:                EntryID(m.OpID, i),
		TenantID:          m.TenantID,
		CustomerID:        m.CustomerID,
		Environment:       m.Environment,
		Delta:             e.Delta,
		Type:              e.Type,
		Source:            e.Source,
		CreditBlockID:     block,
		BillableMetricKey: e.Metric,
		CostUnits:         e.Units,
		ExchangeRate:      e.Rate,
		IdempotencyKey:    m.IdempotencyKey,
		ReferenceID:       e.Ref,
		Reason:            e.Reason,
		Metadata:          meta,
		CreatedAt:         m.At(),
		Draws:             draws,
	}
}

// Block turns a mutation block into a Block of customer.
func (b MutationBlock) Block(customer uuid.UUID) Block {
	meta := Metadata{}
	if len(b.Metadata) > 0 {
		_ = json.Unmarshal(b.Metadata, &meta)
	}
	out := Block{
		ID:              b.ID,
		CustomerID:      customer,
		OriginalAmount:  b.Original,
		RemainingAmount: b.Remaining,
		Source:          b.Source,
		Priority:        b.Priority,
		StartsAt:        time.UnixMilli(b.StartsMS).UTC(),
		CreatedAt:       time.UnixMilli(b.CreatedMS).UTC(),
		Metadata:        meta,
		AppliesTo:       AppliesToOf(b.Scope),
	}
	if b.ExpiresMS != nil {
		t := time.UnixMilli(*b.ExpiresMS).UTC()
		out.ExpiresAt = &t
	}
	return out
}

// AccountState is everything needed to rebuild one customer's Redis state
// from Postgres: the account row, its live blocks, and the operations it
// applied recently (so a retry after a rebuild still replays, invariant 4).
type AccountState struct {
	TenantID       uuid.UUID
	CustomerID     uuid.UUID
	Environment    Environment
	AccountID      string
	Version        int64
	Reserved       int64
	LifetimeEarned int64
	// Debt is what the account owes on its credit line (credit_accounts.debt).
	Debt        int64
	UpdatedAtMS int64
	// Blocks are the blocks with credit left that have not been expired.
	Blocks []MutationBlock
	// Applied are recent mutations with an idempotency key that Postgres
	// holds as operations rows (a consume's, a reserve's, a commit's and a
	// release's record is its ledger entry: persist/ophead.go), newest last. No load writes op keys from them:
	// Postgres answers their retries (AppliedOps).
	Applied []Mutation
	// Reservations are the reservations still active, and those finalized within
	// the last day (so a second commit or release still answers 409).
	Reservations []MutationReservation
	// Gauges are the customer's gauge counters by metric key.
	Gauges map[string]int64
	// Budgets are the counters of the customer's budgets by field
	// (Budget.Field), one per budget, for the period holding the instant
	// they were read: the consumption since its counting start, summed
	// from the ledger (persist fillBudgets; docs/rules.md "Budgets"); and
	// a child's draw counter (DrawLimit.Field), what it drew from its
	// parent since the limit's counting start (docs/rules.md "Shared
	// pools").
	Budgets map[string]BudgetCounter
	// Leases are the customer's active gauge leases (their slots are in
	// Gauges), those past their expires included: a load restores them
	// and the first read lapses them.
	Leases []StoredLease
}

// MutationContext is request context Go hands to a script, which splices it
// verbatim into the Mutation (field "ctx"), so the persister can derive the
// events a mutation owes without another look-up.
type MutationContext struct {
	ExternalID  string        `json:"ext"`
	ThresholdMC int64         `json:"th"`
	Policy      OveragePolicy `json:"policy,omitempty"`
	// LimitMC is the customer's credit line (Customer.CreditLimitMC), which
	// the money scripts allow under policy block (prelude line_split).
	LimitMC int64 `json:"lim,omitempty"`
	// Budgets are the customer's budgets (Customer.Budgets); the store
	// writes them for the scripts as BudgetArg at the command's instant.
	Budgets []Budget `json:"-"`
	// BudgetArg is BudgetArg(Budgets, now), which the money scripts read
	// (lua/prelude/budgets.lua budgets_of).
	BudgetArg string `json:"bud,omitempty"`
	// Event names the credit.granted emitter when it is not a plain grant.
	Emitter string `json:"emitter,omitempty"`
}

// MutationBudget is the budget section of a consume, reserve or commit
// Mutation: the budgets owed credit.budget_reached (once per period).
// Refused marks a refusal record of a charge a budget refused: it owes no
// credit.exhausted.
type MutationBudget struct {
	Reached []BudgetReach `json:"reached"`
	Refused bool          `json:"refused,omitempty"`
}

// BudgetReach is one budget reached: its counter field (Budget.Field), its
// limit, the spend counted in the period and when the period ends (Unix ms).
type BudgetReach struct {
	Field    string `json:"field"`
	LimitMC  int64  `json:"limit"`
	SpentMC  int64  `json:"spent"`
	ResetsMS int64  `json:"resets"`
}

// MutationUsage is what a consume or a reservation commit priced and charged.
type MutationUsage struct {
	Metric  string `json:"metric"`
	Units   int64  `json:"units"`
	Cost    int64  `json:"cost"`
	Charged int64  `json:"charged"`
	Overage int64  `json:"overage"`
	// Refused is true when a block customer was refused (nothing charged).
	Refused bool `json:"refused,omitempty"`
	// ReservationID is set when a commit produced the usage.
	ReservationID *uuid.UUID `json:"reservation,omitempty"`
	// Items is what each metric of a multi-metric consume priced; Metric
	// is then "" and Units the items' total.
	Items []UsageItem `json:"items,omitempty"`
	// Pool is the part of Charged the customer's parent paid (a pool
	// draw: the parent's own Mutation debits it); the consumption entry
	// debits Charged - Pool.
	Pool int64 `json:"pool,omitempty"`
}

// UsageItem is one metric's part of a multi-metric consume. Its names are
// the API's: the script writes one text for the usage and for the ledger
// entry's metadata, which history shows.
type UsageItem struct {
	Metric string `json:"billable_metric_key"`
	Units  int64  `json:"units"`
	Cost   int64  `json:"cost"`
}

// MutationReservation is the full state of a reservation after a mutation.
type MutationReservation struct {
	ID             uuid.UUID         `json:"id"`
	Metric         string            `json:"metric"`
	EstimatedUnits int64             `json:"est_units"`
	EstimatedCost  int64             `json:"est_cost"`
	ActualUnits    *int64            `json:"act_units,omitempty"`
	ActualCost     *int64            `json:"act_cost,omitempty"`
	Released       int64             `json:"released"`
	Status         ReservationStatus `json:"status"`
	ExpiresMS      int64             `json:"expires"`
	CreatedMS      int64             `json:"created"`
	CommittedMS    *int64            `json:"committed,omitempty"`
	ReleasedMS     *int64            `json:"released_at,omitempty"`
	Metadata       json.RawMessage   `json:"meta,omitempty"`
	// Items lists each metric of a multi-metric reservation (Metric is then "",
	// EstimatedUnits and EstimatedCost the items' totals, and at commit
	// ActualUnits and ActualCost too); nil for a single-metric reservation and in
	// a release, which does not carry them (Postgres keeps the stored list).
	Items []ReservationItem `json:"items,omitempty"`
}

// ReservationItem is one metric of a multi-metric reservation: its estimate and,
// once committed, its actual units and their cost (null until then).
type ReservationItem struct {
	BillableMetricKey string `json:"billable_metric_key"`
	EstimatedUnits    int64  `json:"estimated_units"`
	EstimatedCost     int64  `json:"estimated_cost"`
	ActualUnits       *int64 `json:"actual_units"`
	ActualCost        *int64 `json:"actual_cost"`
}

// MutationGauge is a gauge counter after a mutation.
type MutationGauge struct {
	Metric  string `json:"metric"`
	Current int64  `json:"current"`
	// Cap is the cap a move was made under (absent in a lease's renewal
	// or release, and in moves written by earlier releases): a replay
	// answers with it, not with the cap of the moment (gauges.go).
	Cap *int64 `json:"cap,omitempty"`
	// Leases are the leases of the gauge this mutation opened, renewed or
	// ended (leases.go); empty for a plain move.
	Leases []MutationLease `json:"leases,omitempty"`
}

// OutboxMessage is one outbox stream entry and the Mutation it carries.
type OutboxMessage struct {
	ID       string
	Mutation Mutation
}
