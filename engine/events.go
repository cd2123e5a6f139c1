package engine

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// EventType names a webhook event kind (docs/spec/interface.md "Event kinds and emitters").
type EventType string

// Event kinds creditd emits.
const (
	EventCreditGranted    EventType = "credit.granted"
	EventCreditConsumed   EventType = "credit.consumed"
	EventCreditLowBalance EventType = "credit.low_balance"
	EventCreditExhausted  EventType = "credit.exhausted"
	// EventCreditExpired fires for each block that expired with credit left
	// (docs/spec/addendum.md §8 "Also emitted").
	EventCreditExpired EventType = "credit.expired"
	// EventCreditBudgetReached fires once per period of a budget: when a
	// charge brings its spend to its limit, or a charge is refused by it
	// first (docs/rules.md "Budgets").
	EventCreditBudgetReached EventType = "credit.budget_reached"
	EventTestPing            EventType = "test.ping"
)

// EventStatus is a webhook event's delivery state (docs/spec/interface.md "States and
// transitions", Webhook event).
type EventStatus string

// Event states.
const (
	EventPending    EventStatus = "pending"
	EventDelivered  EventStatus = "delivered"
	EventFailed     EventStatus = "failed"
	EventDeadLetter EventStatus = "dead_letter"
)

// Event is one webhook event: what a tenant is owed, its delivery state and
// the attempts made so far.
type Event struct {
	ID          uuid.UUID   `json:"id"`
	TenantID    uuid.UUID   `json:"-"`
	Environment Environment `json:"environment"`
	CustomerID  *uuid.UUID  `json:"-"`
	EventType   EventType   `json:"event_type"`
	// Sequence is the event's place among its tenant's events: 1, 2, 3, ...
	// with no gap, given when the event is stored (issue 15 item 2).
	Sequence *int64 `json:"sequence"`
	// Version is the customer's account version after the Mutation that
	// produced the event; nil for events no Mutation produced
	// (subscription events, test.ping).
	Version *int64 `json:"version"`
	// Payload is the exact JSON body delivered (an Envelope).
	Payload     json.RawMessage `json:"payload"`
	Status      EventStatus     `json:"status"`
	Attempts    int             `json:"attempts"`
	NextRetryAt *time.Time      `json:"next_retry_at"`
	LastError   *string         `json:"last_error"`
	CreatedAt   time.Time       `json:"created_at"`
	DeliveredAt *time.Time      `json:"delivered_at"`
	// Deliveries are the attempts, oldest first.
	Deliveries []Delivery `json:"deliveries"`
}

// Delivery is one recorded delivery attempt.
type Delivery struct {
	ID           uuid.UUID `json:"-"`
	EventID      uuid.UUID `json:"-"`
	StatusCode   *int      `json:"status_code"`
	ResponseBody string    `json:"response_body"`
	Error        *string   `json:"error"`
	DurationMS   int64     `json:"duration_ms"`
	CreatedAt    time.Time `json:"created_at"`
}

// Envelope is the delivered body of every event (docs/spec/addendum.md §8).
type Envelope struct {
	// Sequence is set by the store, which prepends it to the stored body;
	// Go never marshals it.
	Sequence           *int64      `json:"sequence,omitempty"`
	EventID            uuid.UUID   `json:"event_id"`
	EventType          EventType   `json:"event_type"`
	TenantID           uuid.UUID   `json:"tenant_id"`
	Environment        Environment `json:"environment"`
	CustomerID         *uuid.UUID  `json:"customer_id"`
	ExternalCustomerID *string     `json:"external_customer_id"`
	CreatedAt          time.Time   `json:"created_at"`
	IdempotencyKey     string      `json:"idempotency_key"`
	// Version is the customer's account version after the Mutation that
	// produced the event; null for events no Mutation produced.
	Version *int64 `json:"version"`
	Data    any    `json:"data"`
}

// GrantedData is the data of credit.granted: the grant's figures and its
// ledger entry's fields (docs/spec/interface.md "Delivered body").
type GrantedData struct {
	TransactionID uuid.UUID `json:"transaction_id"`
	Credits       int64     `json:"credits"`
	Source        *Source   `json:"source"`
	Reason        *string   `json:"reason"`
	// BalanceAfter is the effective balance after the grant.
	BalanceAfter int64 `json:"balance_after"`
	LedgerEntry
}

// ConsumedData is the data of credit.consumed (docs/spec/addendum.md §8).
type ConsumedData struct {
	TransactionID     uuid.UUID  `json:"transaction_id"`
	BillableMetricKey *string    `json:"billable_metric_key"`
	Units             *int64     `json:"units"`
	Credits           int64      `json:"credits"`
	OverageMC         int64      `json:"overage_mc"`
	BalanceAfter      int64      `json:"balance_after"`
	ReservationID     *uuid.UUID `json:"reservation_id"`
	// Items lists each metric's units and cost of a multi-metric consume
	// (billable_metric_key and units are then null); absent otherwise.
	Items []ItemCost `json:"items,omitempty"`
}

// LowBalanceData is the data of credit.low_balance.
type LowBalanceData struct {
	BalanceMC   int64 `json:"balance_mc"`
	ThresholdMC int64 `json:"threshold_mc"`
}

// ExhaustedData is the data of credit.exhausted.
type ExhaustedData struct {
	BalanceMC         int64   `json:"balance_mc"`
	BillableMetricKey *string `json:"billable_metric_key"`
}

// ExpiredData is the data of credit.expired: the expiry ledger entry, the
// block it closed and the credit it took (positive).
type ExpiredData struct {
	TransactionID uuid.UUID  `json:"transaction_id"`
	CreditBlockID *uuid.UUID `json:"credit_block_id"`
	Credits       int64      `json:"credits"`
	Source        *Source    `json:"source"`
}

// BudgetReachedData is the data of credit.budget_reached: the budget (its
// metric key, null for every metric, its period and limit), the spend
// counted in the period, when the period ends, and whether a refused
// charge reached it (the spend is then below the limit).
type BudgetReachedData struct {
	BillableMetricKey *string      `json:"billable_metric_key"`
	Period            BudgetPeriod `json:"period"`
	LimitMC           int64        `json:"limit_mc"`
	SpentMC           int64        `json:"spent_mc"`
	ResetsAt          time.Time    `json:"resets_at"`
	Refused           bool         `json:"refused"`
}

// budgetReachedData is the data of m's budget reach r.
func budgetReachedData(r BudgetReach, refused bool) BudgetReachedData {
	p, metric := BudgetOfField(r.Field)
	var key *string
	if metric != "" {
		key = &metric
	}
	return BudgetReachedData{BillableMetricKey: key, Period: p, LimitMC: r.LimitMC, SpentMC: r.SpentMC,
		ResetsAt: time.UnixMilli(r.ResetsMS).UTC(), Refused: refused}
}

// PingData is the data of test.ping.
type PingData struct {
	Message string `json:"message"`
}

// EffectiveAfter is the effective balance after m: balance - reserved - pending.
func (m *Mutation) EffectiveAfter() int64 {
	return m.Account.Balance - m.Account.Reserved - m.Account.Pending
}

// EffectiveBeforeOf is the effective balance before m: the script's figure
// when it gave one, else derived from what a debit or consume took (neither
// moves reserved or pending). ok is false when it cannot be known.
func EffectiveBeforeOf(m *Mutation) (int64, bool) {
	if m.EffectiveBefore != nil {
		return *m.EffectiveBefore, true
	}
	after := m.EffectiveAfter()
	switch m.Kind {
	case MutationDebit:
		return after + m.mainDebited(), true
	case MutationConsume:
		if m.Usage != nil {
			return after + m.Usage.Charged, true
		}
	}
	return 0, false
}

// mainDebited is the credit the main entries took (positive).
func (m *Mutation) mainDebited() int64 {
	var n int64
	for _, e := range m.Entries {
		if e.Role == RoleMain && e.Delta < 0 {
			n -= e.Delta
		}
	}
	return n
}

// firstMain is the index of the first main entry, -1 when none.
func (m *Mutation) firstMain() int {
	for i, e := range m.Entries {
		if e.Role == RoleMain {
			return i
		}
	}
	return -1
}

// LowBalanceCrossed reports a crossing of threshold: from at-or-above it to
// below it (docs/spec/addendum.md §8). A threshold of 0 is off.
func LowBalanceCrossed(before, after, threshold int64) bool {
	return threshold > 0 && before >= threshold && after < threshold
}

// crossingKinds are the operations credit.low_balance and credit.exhausted
// watch (docs/spec/interface.md: consume, reservation create, commit, adjust).
func crossingKind(k MutationKind) bool {
	switch k {
	case MutationConsume, MutationReserve, MutationCommit, MutationDebit:
		return true
	}
	return false
}

// EventsOf derives the events a Mutation owes; it is pure, so the persister
// writes them in the same transaction as the Mutation's ledger entries and a
// replay derives the same ids. The rules (docs/spec/interface.md "Event kinds and
// emitters", docs/spec/addendum.md §8):
//   - grant: credit.granted (a positive adjust or a grant; ctx.Emitter names
//     other emitters), except for an import (EmitterImport), which never
//     fires it;
//   - consume that charged something, commit with usage, debit (negative
//     adjust): credit.consumed; a consume that charged nothing but ran into
//     overage fires it too, except under notify (no webhook for overage);
//   - consume, reserve, commit, debit: credit.low_balance when the effective
//     balance crosses the threshold downwards, credit.exhausted when it moves
//     from > 0 to 0 (with a credit line: when it plus the line does,
//     ExhaustedCrossed); a refused block consume fires credit.exhausted;
//   - consume, reserve, commit: credit.budget_reached for each budget
//     the charge brought to its limit, or that refused it (then nothing
//     else: a budget refusal is not one for credit), once per period;
//   - every Mutation: credit.expired for each expiry entry that took credit
//     (a block expired with credit left, docs/spec/addendum.md §8), before the others, as
//     the expiry came first;
//   - nothing else for release, gauge, expiry or load.
//
// A Mutation without a Context yields no credit.low_balance (its threshold is
// unknown here) and a null external_customer_id; the persister fills both in.
func EventsOf(m Mutation) []Event { return eventsOf(m, false) }

// EventsOfCarried is EventsOf for a persister whose ledger row carries m's
// credit.consumed event (the event is rebuilt from the row when read): that
// event comes without a payload, which nothing would read, and the
// envelope's JSON is not built for it on every consume.
func EventsOfCarried(m Mutation) []Event { return eventsOf(m, true) }

func eventsOf(m Mutation, carried bool) []Event {
	var out []Event
	ext, threshold := (*string)(nil), int64(0)
	if m.Context != nil {
		ext = &m.Context.ExternalID
		threshold = m.Context.ThresholdMC
	}
	add := func(slot EventSlot, t EventType, data any) {
		out = append(out, newMutationEvent(m, slot, t, ext, data))
	}
	for i, e := range m.Entries {
		if e.Type == EntryExpiry && e.Delta < 0 {
			add(ExpiredSlot(i), EventCreditExpired, ExpiredData{TransactionID: EntryID(m.OpID, i),
				CreditBlockID: e.BlockID, Credits: -e.Delta, Source: e.Source})
		}
	}
	after := m.EffectiveAfter()
	main := m.firstMain()
	switch m.Kind {
	case MutationGrant:
		if main < 0 || (m.Context != nil && m.Context.Emitter == EmitterImport) {
			break
		}
		e := m.ledgerEntry(main, m.Entries[main])
		add(SlotMain, EventCreditGranted, GrantedData{TransactionID: e.ID, Credits: e.Delta,
			Source: e.Source, Reason: e.Reason, BalanceAfter: after, LedgerEntry: e})
	case MutationDebit:
		if main < 0 {
			break
		}
		if carried {
			out = append(out, bareMutationEvent(m, SlotMain, EventCreditConsumed))
			break
		}
		add(SlotMain, EventCreditConsumed, ConsumedData{TransactionID: EntryID(m.OpID, main),
			Credits: m.mainDebited(), BalanceAfter: after})
	case MutationConsume, MutationCommit:
		u := m.Usage
		if u == nil || u.Refused || main < 0 {
			break
		}
		policy := OveragePolicy("")
		if m.Context != nil {
			policy = m.Context.Policy
		}
		switch {
		case u.Charged <= 0 && (u.Overage <= 0 || policy == OveragePolicyNotify):
		case carried:
			out = append(out, bareMutationEvent(m, SlotMain, EventCreditConsumed))
		default:
			add(SlotMain, EventCreditConsumed, consumedData(&m, main))
		}
	}
	if !crossingKind(m.Kind) {
		return out
	}
	var metric *string
	if m.Usage != nil && m.Usage.Metric != "" {
		k := m.Usage.Metric
		metric = &k
	} else if m.Reservation != nil && m.Reservation.Metric != "" {
		k := m.Reservation.Metric
		metric = &k
	}
	if b := m.Budget; b != nil {
		for i, r := range b.Reached {
			add(BudgetSlot(i), EventCreditBudgetReached, budgetReachedData(r, b.Refused))
		}
		// A budget's refusal is not one for credit: no credit.exhausted.
		if b.Refused {
			return out
		}
	}
	if m.Usage != nil && m.Usage.Refused {
		add(SlotExhausted, EventCreditExhausted, ExhaustedData{BalanceMC: 0, BillableMetricKey: metric})
		return out
	}
	before, ok := EffectiveBeforeOf(&m)
	if !ok {
		return out
	}
	if LowBalanceCrossed(before, after, threshold) {
		add(SlotLowBalance, EventCreditLowBalance, LowBalanceData{BalanceMC: after, ThresholdMC: threshold})
	}
	if lim := m.lineMC(); ExhaustedCrossed(before, after, lim) {
		// With a credit line the effective balance at exhaustion is minus
		// the line (or below it, for a commit under allow): it is reported
		// as it is; without one it is 0 as ever.
		balance := int64(0)
		if lim > 0 {
			balance = after
		}
		add(SlotExhausted, EventCreditExhausted, ExhaustedData{BalanceMC: balance, BillableMetricKey: metric})
	}
	return out
}

// lineMC is the credit line m's customer had under policy block (0 under
// allow and notify, which never draw it, and without a Context).
func (m *Mutation) lineMC() int64 {
	if m.Context == nil || m.Context.Policy == OveragePolicyAllow || m.Context.Policy == OveragePolicyNotify {
		return 0
	}
	return m.Context.LimitMC
}

// ExhaustedCrossed reports whether an operation that moved the effective
// balance from before to after exhausted the customer's credit: what it may
// still spend, the effective balance plus its credit line lineMC (0 without
// one), went from > 0 to <= 0 (docs/rules.md "Credit line"). Without a line
// it is the effective balance reaching 0 (docs/spec/addendum.md §8).
func ExhaustedCrossed(before, after, lineMC int64) bool {
	b, okB := AddChecked(before, lineMC)
	a, okA := AddChecked(after, lineMC)
	if !okB || !okA {
		return false
	}
	return b > 0 && a <= 0
}

// LowBalanceEvent is the credit.low_balance event m owes under threshold,
// for a persister that learns the threshold only after EventsOf (a Mutation
// without a Context). ok is false when m does not cross it.
func LowBalanceEvent(m Mutation, threshold int64) (Event, bool) {
	if !crossingKind(m.Kind) || (m.Usage != nil && m.Usage.Refused) {
		return Event{}, false
	}
	before, ok := EffectiveBeforeOf(&m)
	after := m.EffectiveAfter()
	if !ok || !LowBalanceCrossed(before, after, threshold) {
		return Event{}, false
	}
	var ext *string
	if m.Context != nil {
		ext = &m.Context.ExternalID
	}
	return newMutationEvent(m, SlotLowBalance, EventCreditLowBalance, ext,
		LowBalanceData{BalanceMC: after, ThresholdMC: threshold}), true
}

// consumedData is the credit.consumed data of consume or commit m, whose
// main entry is m.Entries[main].
func consumedData(m *Mutation, main int) ConsumedData {
	u := m.Usage
	metric, units := u.Metric, u.Units
	d := ConsumedData{TransactionID: EntryID(m.OpID, main),
		BillableMetricKey: &metric, Units: &units, Credits: u.Charged, OverageMC: u.Overage,
		BalanceAfter: m.EffectiveAfter(), ReservationID: u.ReservationID}
	if u.Items != nil {
		d.BillableMetricKey, d.Units = nil, nil
		d.Items = make([]ItemCost, len(u.Items))
		for i, it := range u.Items {
			d.Items[i] = ItemCost{BillableMetricKey: it.Metric, Units: it.Units, Cost: it.Cost}
		}
	}
	return d
}

// CarriedConsumedEvent is the credit.consumed of consume m as a store
// that keeps it on m's main ledger entry rebuilds it (ext: the customer's
// external id): the event EventsOf owes, under CarriedEventID of that
// entry (event_ids.go). Whether m owed one at all was decided when it was
// stored; this only rebuilds it.
func CarriedConsumedEvent(m Mutation, main int, ext *string) Event {
	customer, version := m.CustomerID, m.Account.Version
	return newEvent(CarriedEventID(EntryID(m.OpID, main)), EventCreditConsumed, m.TenantID, m.Environment,
		&customer, ext, m.At(), m.IdempotencyKey, &version, consumedData(&m, main))
}

func newMutationEvent(m Mutation, slot EventSlot, t EventType, ext *string, data any) Event {
	customer, version := m.CustomerID, m.Account.Version
	return newEvent(EventID(m.OpID, slot), t, m.TenantID, m.Environment, &customer, ext, m.At(), m.IdempotencyKey,
		&version, data)
}

// bareMutationEvent is newMutationEvent without a payload (EventsOfCarried).
func bareMutationEvent(m Mutation, slot EventSlot, t EventType) Event {
	customer, version := m.CustomerID, m.Account.Version
	return pendingEvent(EventID(m.OpID, slot), t, m.TenantID, m.Environment, &customer, m.At(), &version)
}

// NewEvent builds a pending event and its delivered body; the first attempt
// is due at once (at created).
func NewEvent(id uuid.UUID, t EventType, tenant uuid.UUID, env Environment, customer *uuid.UUID, ext *string,
	created time.Time, idemKey string, data any) Event {
	return newEvent(id, t, tenant, env, customer, ext, created, idemKey, nil, data)
}

// newEvent is NewEvent with the account version of the Mutation behind
// the event (nil: none).
func newEvent(id uuid.UUID, t EventType, tenant uuid.UUID, env Environment, customer *uuid.UUID, ext *string,
	created time.Time, idemKey string, version *int64, data any) Event {
	created = created.UTC()
	payload, err := appendEnvelopeJSON(make([]byte, 0, 512), &Envelope{EventID: id, EventType: t, TenantID: tenant, Environment: env,
		CustomerID: customer, ExternalCustomerID: ext, CreatedAt: created, IdempotencyKey: idemKey, Version: version,
		Data: data})
	if err != nil {
		// Every data type above marshals; a failure is a programming error.
		panic("engine: marshal event payload: " + err.Error())
	}
	e := pendingEvent(id, t, tenant, env, customer, created, version)
	e.Payload = payload
	return e
}

// pendingEvent is newEvent's event before its payload: pending, its first
// attempt due at once.
func pendingEvent(id uuid.UUID, t EventType, tenant uuid.UUID, env Environment, customer *uuid.UUID,
	created time.Time, version *int64) Event {
	created = created.UTC()
	next := created
	return Event{ID: id, TenantID: tenant, Environment: env, CustomerID: customer, EventType: t, Version: version,
		Status: EventPending, NextRetryAt: &next, CreatedAt: created}
}
