package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Reservation limits (docs/spec/interface.md Limits).
const (
	DefaultReservationTTLSeconds = 1800
	MaxReservationTTLSeconds     = 86400
)

// CheckReservationTTL refuses a reservation's ttl_seconds (a create's or an
// extend's) outside 1..MaxReservationTTLSeconds.
func CheckReservationTTL(ttl int64) error {
	if ttl < 1 || ttl > MaxReservationTTLSeconds {
		return Invalid("ttl_seconds", fmt.Sprintf("ttl_seconds must be between 1 and %d", MaxReservationTTLSeconds))
	}
	return nil
}

// MaxActiveReservations bounds one customer's active reservations (invariant 13):
// every money script on the customer reads them. lua/prelude/bounds.lua
// MAX_ACTIVE_RESERVATIONS enforces it atomically.
const MaxActiveReservations = 100

// ErrTooManyReservations refuses a reservation past MaxActiveReservations: a 409 (a state
// limit), nothing written.
var ErrTooManyReservations = &Error{Kind: KindConflict, Field: "customer_id",
	Detail: "the customer already has 100 active reservations, the most allowed; commit or release some first"}

// Reservations holds credit for jobs of unknown cost.
type Reservations struct {
	ent       *Entitlements
	credits   *Credits
	customers *Customers
	lookup    CustomerLookup
	metering  *Metering
	hot       MeteringStore
	reader    ReservationReader
	clock     Clock
}

// ReservationsDeps is what the reservation service is built from.
type ReservationsDeps struct {
	// Entitlements prices and admits a reservation as a consume would.
	Entitlements *Entitlements
	Credits      *Credits
	Customers    *Customers
	// Lookup resolves the customer of a reserve, commit and release (a
	// CachedCustomers in a running creditd; nil: Customers).
	Lookup CustomerLookup
	// Metering prices a commit by the rule active then (nil: none).
	Metering     *Metering
	Hot          MeteringStore
	Reservations ReservationReader
	Clock        Clock
}

// NewReservations returns the reservation service.
func NewReservations(d ReservationsDeps) *Reservations {
	if d.Lookup == nil {
		d.Lookup = d.Customers
	}
	return &Reservations{lookup: d.Lookup, ent: d.Entitlements, credits: d.Credits, customers: d.Customers, metering: d.Metering,
		hot: d.Hot, reader: d.Reservations, clock: d.Clock}
}

// CreateReservation is a checked reservation request: Metric and
// EstimatedUnits for one metric, or Items (non-nil) for several.
type CreateReservation struct {
	// Customer is by id (created when unknown) or strictly by external id.
	Customer       CustomerRef
	Metric         string
	EstimatedUnits int64
	// TTLSeconds is how long the reservation stands, 1 to MaxReservationTTLSeconds.
	TTLSeconds int64
	// Metadata is canonical (nil when none was given).
	Metadata Metadata
	Items    []ReserveItem
	// Dry asks what the reservation would do without taking it (issue 28 item 5):
	// no customer is created and no Idempotency-Key is claimed.
	Dry bool
}

// ReserveItem is one checked metric of a multi-metric reservation.
type ReserveItem struct {
	Metric         string
	EstimatedUnits int64
}

// MaxReservationItems bounds a multi-metric reservation, as
// MaxConsumeItems bounds a consume: its items are priced in one script.
const MaxReservationItems = MaxConsumeItems

// ReservationAccount is the account member of reservation responses.
type ReservationAccount struct {
	Balance          int64 `json:"balance"`
	ReservedBalance  int64 `json:"reserved_balance"`
	EffectiveBalance int64 `json:"effective_balance"`
}

// ReserveResult is the 201 body of POST /v1/reservations.
type ReserveResult struct {
	ID                uuid.UUID          `json:"id"`
	CustomerID        uuid.UUID          `json:"customer_id"`
	BillableMetricKey string             `json:"billable_metric_key"`
	EstimatedUnits    int64              `json:"estimated_units"`
	EstimatedCost     int64              `json:"estimated_cost"`
	Environment       Environment        `json:"environment"`
	Status            ReservationStatus  `json:"status"`
	ExpiresAt         time.Time          `json:"expires_at"`
	Account           ReservationAccount `json:"account"`
	Metadata          Metadata           `json:"metadata"`
	CreatedAt         time.Time          `json:"created_at"`
	// Items lists each metric's estimate of a multi-metric reservation
	// (BillableMetricKey is then "", the units and cost the totals).
	Items []ReservationItem `json:"items,omitempty"`
	// Dry marks a dry run's answer: the reservation as it would be taken, which
	// does not exist (no id), and the events taking it would fire.
	Dry    bool        `json:"-"`
	Events []EventType `json:"-"`
}

// Create holds the estimated cost. Errors: 400 (unknown strict external
// id, cross-tenant id), 422 (pricing overflow), 409 (insufficient credits,
// usage not allowed), 500 when the metric has no active rule (as the spec
// documents).
func (s *Reservations) Create(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in CreateReservation) (ReserveResult, error) {
	if in.Items != nil {
		return s.createMulti(ctx, scope, tenant, idem, in)
	}
	rule, err := s.ent.meteredRule(ctx, scope, in.Metric)
	if err != nil {
		if e, ok := AsError(err); ok && e.Kind == KindNotFound {
			return ReserveResult{}, DocumentedInternal("the metric has no active metering rule")
		}
		return ReserveResult{}, err
	}
	if _, err := Price(rule, in.EstimatedUnits); err != nil {
		return ReserveResult{}, priceError(err, "estimated_units")
	}
	c, err := s.holder(ctx, scope, in.Customer, in.Dry)
	if err != nil {
		return ReserveResult{}, err
	}
	if err := s.ent.usageAllowed(ctx, c, rule.BillableMetricKey); err != nil {
		return ReserveResult{}, err
	}
	now := s.clock.Now()
	cmd := ReserveCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, now), ReservationID: uuid.Must(uuid.NewV7()), Metric: rule.BillableMetricKey,
		EstimatedUnits: in.EstimatedUnits, Terms: TermsOf(rule), ExpiresAt: now.Add(time.Duration(in.TTLSeconds) * time.Second),
		Metadata: orEmpty(in.Metadata), Context: contextOf(c, tenant)}
	return s.reserve(ctx, c, cmd, in.Dry, "estimated_units")
}

// reserve runs cmd for c (dry: on a scratch copy, MeteringStore.ReserveDry);
// field names an overflow.
func (s *Reservations) reserve(ctx context.Context, c Customer, cmd ReserveCommand, dry bool, field string) (ReserveResult, error) {
	run := s.hot.Reserve
	if dry {
		run = s.hot.ReserveDry
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return run(ctx, cmd) })
	if dry && errors.Is(err, ErrInsufficientCredits) {
		return ReserveResult{}, dryRefusal(res.Mutation)
	}
	if dry && errors.Is(err, ErrBudgetExceeded) {
		return ReserveResult{}, dryBudgetRefusal(err, res.Mutation)
	}
	if err != nil {
		return ReserveResult{}, priceError(err, field)
	}
	out := reserveResult(c, res.Mutation)
	if dry {
		out.Dry, out.Events = true, eventTypes(EventsOf(res.Mutation))
	}
	return out, nil
}

// reserveResult is the 201 body of the reservation m took for c.
func reserveResult(c Customer, m Mutation) ReserveResult {
	r := reservationOf(m)
	return ReserveResult{ID: r.ID, CustomerID: c.ID, BillableMetricKey: r.BillableMetricKey,
		EstimatedUnits: r.EstimatedUnits, EstimatedCost: r.EstimatedCost, Environment: c.Environment,
		Status: r.Status, ExpiresAt: r.ExpiresAt, Account: reservationAccount(m), Metadata: r.Metadata, CreatedAt: r.CreatedAt,
		Items: r.Items}
}

// holder is the customer a reservation is for: by id, created when unknown, or
// strictly by external id (an unknown one is a 400).
func (s *Reservations) holder(ctx context.Context, scope Scope, ref CustomerRef, dry bool) (Customer, error) {
	c, err := s.lookup.Resolve(ctx, scope, ref, !ref.Strict && !dry)
	if dry && !ref.Strict {
		// A dry run creates no customer: an unknown id is a 404 here.
		return c, err
	}
	if e, ok := AsError(err); ok && e.Kind == KindNotFound {
		return Customer{}, BadRequest("external_customer_id", "no customer with this external_customer_id")
	}
	return c, err
}

// createMulti holds the summed estimated cost of in.Items (the
// multi-metric form) in one script, all or none. Errors as Create; an
// item's error names it (items[2].estimated_units), and a metric without
// an active rule is a 422 naming the item (the single form's 500 is the
// spec's, kept for it alone).
func (s *Reservations) createMulti(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in CreateReservation) (ReserveResult, error) {
	lines := make([]ReserveLine, len(in.Items))
	var units, cost int64
	for i, it := range in.Items {
		field := fmt.Sprintf("items[%d].", i)
		rule, err := s.ent.meteredRule(ctx, scope, it.Metric)
		if err != nil {
			if e, ok := AsError(err); ok && e.Kind == KindNotFound {
				return ReserveResult{}, Invalid(field+"billable_metric_key", "no active metering rule for "+it.Metric)
			}
			return ReserveResult{}, refield(err, "billable_metric_key", field+"billable_metric_key")
		}
		c, err := Price(rule, it.EstimatedUnits)
		if err != nil {
			return ReserveResult{}, priceError(err, field+"estimated_units")
		}
		var ok bool
		if units, ok = addInt64(units, it.EstimatedUnits); !ok {
			return ReserveResult{}, Invalid("items", "the items' total estimated units would overflow a 64-bit amount")
		}
		if cost, ok = addInt64(cost, c); !ok {
			return ReserveResult{}, Invalid("items", "the items' total estimated cost would overflow a 64-bit amount")
		}
		lines[i] = ReserveLine{Metric: rule.BillableMetricKey, EstimatedUnits: it.EstimatedUnits, Terms: TermsOf(rule)}
	}
	c, err := s.holder(ctx, scope, in.Customer, in.Dry)
	if err != nil {
		return ReserveResult{}, err
	}
	for _, l := range lines {
		if err := s.ent.usageAllowed(ctx, c, l.Metric); err != nil {
			return ReserveResult{}, err
		}
	}
	now := s.clock.Now()
	cmd := ReserveCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, now), ReservationID: uuid.Must(uuid.NewV7()), Items: lines,
		ExpiresAt: now.Add(time.Duration(in.TTLSeconds) * time.Second), Metadata: orEmpty(in.Metadata), Context: contextOf(c, tenant)}
	return s.reserve(ctx, c, cmd, in.Dry, "items")
}

// Get reads a reservation of the tenant, in either environment. Errors: 404.
func (s *Reservations) Get(ctx context.Context, scope Scope, id uuid.UUID) (Reservation, error) {
	_, reservation, err := s.locate(ctx, scope, id)
	return reservation, err
}

// List pages a customer's reservations newest first; the customer is never created.
// An unrecognized status is the 500 the spec documents.
func (s *Reservations) List(ctx context.Context, scope Scope, ref CustomerRef, status, cursor string, limit int) (Page[Reservation], error) {
	if status != "" && !ReservationStatus(status).Valid() {
		return Page[Reservation]{}, DocumentedInternal("unrecognized reservation status filter: use active, committed, released or expired")
	}
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Page[Reservation]{}, err
	}
	s.credits.awaitPersisted(ctx, CustomerKeyOf(c))
	return s.reader.ListReservations(ctx, CustomerKeyOf(c), status, cursor, limit)
}

// find is the reservation id with its customer for a commit or release: from
// Redis alone when its reservation index describes the reservation (the customer
// from the customer look-up; the stored metadata, when withMeta, from the
// customer's hash), else as locate finds it. A reservation found in Redis has no
// Status (hotMiss tells them apart): the script answers for its state, and
// nothing waits for Postgres to catch up (issue 10).
func (s *Reservations) find(ctx context.Context, scope Scope, id uuid.UUID, withMeta bool) (Customer, Reservation, error) {
	ref, ok, err := s.hot.ReservationRef(ctx, id)
	if err != nil {
		return Customer{}, Reservation{}, err
	}
	if !ok || !ref.Described {
		return s.locate(ctx, scope, id)
	}
	if ref.Customer.TenantID != scope.TenantID {
		return Customer{}, Reservation{}, NotFound("reservation not found")
	}
	reservation := Reservation{ID: id, TenantID: ref.Customer.TenantID, CustomerID: ref.Customer.CustomerID,
		Environment: ref.Customer.Environment, BillableMetricKey: ref.Metric, Items: ref.Items}
	if withMeta {
		meta, found, err := s.hot.ReservationMetadata(ctx, ref.Customer, id)
		if err != nil {
			return Customer{}, Reservation{}, err
		}
		if !found {
			return s.locate(ctx, scope, id)
		}
		reservation.Metadata = meta
	}
	c, err := s.lookup.CustomerByKey(ctx, ref.Customer)
	if err != nil {
		// A deleted customer's reservations can still be settled.
		c = Customer{ID: ref.Customer.CustomerID, TenantID: ref.Customer.TenantID, Environment: ref.Customer.Environment}
	}
	return c, reservation, nil
}

// hotMiss reports whether a commit or release of a reservation find took from
// Redis alone failed because Redis no longer holds it (finalized and
// dropped) or the customer's state: Postgres answers then, through locate,
// as it did before the index described holds. Nothing was written.
func (s *Reservations) hotMiss(reservation Reservation, err error) bool {
	return reservation.Status == "" && (errors.Is(err, ErrReservationNotFound) || errors.Is(err, ErrStateMissing))
}

// run runs a commit or release script: for a reservation locate found, loading
// the customer's state first when Redis lacks it (withLoad); for one find
// took from Redis, once (hotMiss sends a miss to locate's path).
func (s *Reservations) run(ctx context.Context, reservation Reservation, c CustomerKey, op func() (MutationResult, error)) (MutationResult, error) {
	if reservation.Status == "" {
		return op()
	}
	return withLoad(ctx, s.credits, c, op)
}

// locate finds a reservation's customer (Redis index, else Postgres) and its
// persisted row, refusing other tenants' reservations with a 404.
func (s *Reservations) locate(ctx context.Context, scope Scope, id uuid.UUID) (Customer, Reservation, error) {
	ref, ok, err := s.hot.ReservationRef(ctx, id)
	if err != nil {
		return Customer{}, Reservation{}, err
	}
	key := ref.Customer
	if !ok {
		key, err = s.reader.ReservationCustomer(ctx, scope.TenantID, id)
		if errors.Is(err, ErrNotFound) {
			// A reservation made a moment ago, on any node, may still be on its
			// way to Postgres: wait for the outbox, then look again.
			s.credits.behind.All(ctx)
			key, err = s.reader.ReservationCustomer(ctx, scope.TenantID, id)
		}
		if errors.Is(err, ErrNotFound) {
			return Customer{}, Reservation{}, NotFound("reservation not found")
		}
		if err != nil {
			return Customer{}, Reservation{}, err
		}
	}
	if key.TenantID != scope.TenantID {
		return Customer{}, Reservation{}, NotFound("reservation not found")
	}
	s.credits.awaitPersisted(ctx, key)
	reservation, err := s.reader.GetReservation(ctx, scope.TenantID, id)
	if errors.Is(err, ErrNotFound) {
		return Customer{}, Reservation{}, NotFound("reservation not found")
	}
	if err != nil {
		return Customer{}, Reservation{}, err
	}
	c, err := s.customers.ByID(ctx, key.CustomerID)
	if err != nil {
		// A deleted customer's reservations can still be settled.
		c = Customer{ID: key.CustomerID, TenantID: key.TenantID, Environment: key.Environment}
	}
	return c, reservation, nil
}

func reservationOf(m Mutation) Reservation {
	r := m.Reservation
	if r == nil {
		return Reservation{}
	}
	out := Reservation{ID: r.ID, TenantID: m.TenantID, CustomerID: m.CustomerID, Environment: m.Environment,
		BillableMetricKey: r.Metric, EstimatedUnits: r.EstimatedUnits, EstimatedCost: r.EstimatedCost,
		ActualUnits: r.ActualUnits, ActualCost: r.ActualCost, Status: r.Status, ReferenceID: r.ID,
		ExpiresAt: time.UnixMilli(r.ExpiresMS).UTC(), CreatedAt: time.UnixMilli(r.CreatedMS).UTC(), Metadata: Metadata{},
		Items: r.Items}
	if len(r.Metadata) > 0 {
		_ = json.Unmarshal(r.Metadata, &out.Metadata)
	}
	if r.CommittedMS != nil {
		t := time.UnixMilli(*r.CommittedMS).UTC()
		out.CommittedAt = &t
	}
	if r.ReleasedMS != nil {
		t := time.UnixMilli(*r.ReleasedMS).UTC()
		out.ReleasedAt = &t
	}
	out.Settle(r.Released)
	return out
}

func reservationAccount(m Mutation) ReservationAccount {
	a := m.Account
	return ReservationAccount{Balance: a.Balance, ReservedBalance: a.Reserved, EffectiveBalance: a.Balance - a.Reserved - a.Pending}
}
