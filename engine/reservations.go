package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Reservation limits (interface.md Limits).
const (
	DefaultReservationTTLSeconds = 1800
	MaxReservationTTLSeconds     = 86400
)

// MaxActiveHolds bounds one customer's active reservations (invariant 13):
// every money script on the customer reads them. lua/prelude.lua
// MAX_ACTIVE_HOLDS enforces it atomically.
const MaxActiveHolds = 100

// ErrTooManyHolds refuses a reservation past MaxActiveHolds: a 409 (a state
// limit), nothing written.
var ErrTooManyHolds = &Error{Kind: KindConflict, Field: "customer_id",
	Detail: "the customer already has 100 active reservations, the most allowed; commit or release some first"}

// HoldReader reads reservations from the system of record.
type HoldReader interface {
	// GetReservation finds a hold by id in any tenant (ErrNotFound).
	GetReservation(ctx context.Context, id uuid.UUID) (Reservation, error)
	// ListReservations pages a customer's holds newest first; status "" is all.
	ListReservations(ctx context.Context, customer uuid.UUID, status string, cursor string, limit int) (Page[Reservation], error)
	// ReservationCustomer finds the customer of a hold (ErrNotFound).
	ReservationCustomer(ctx context.Context, id uuid.UUID) (CustomerKey, error)
}

// Reservations holds credit for jobs of unknown cost.
type Reservations struct {
	ent    *Entitlements
	reader HoldReader
}

// NewReservations returns the reservation service.
func NewReservations(ent *Entitlements, reader HoldReader) *Reservations {
	return &Reservations{ent: ent, reader: reader}
}

// ReserveInput is the body of POST /v1/reservations.
type ReserveInput struct {
	CustomerID         *string  `json:"customer_id"`
	ExternalCustomerID *string  `json:"external_customer_id"`
	BillableMetricKey  *string  `json:"billable_metric_key"`
	EstimatedUnits     *int64   `json:"estimated_units"`
	TTLSeconds         *int64   `json:"ttl_seconds"`
	Metadata           Metadata `json:"metadata"`
}

// HoldAccount is the account member of reservation responses.
type HoldAccount struct {
	Balance          int64 `json:"balance"`
	ReservedBalance  int64 `json:"reserved_balance"`
	EffectiveBalance int64 `json:"effective_balance"`
}

// ReserveResult is the 201 body of POST /v1/reservations.
type ReserveResult struct {
	ID                uuid.UUID         `json:"id"`
	CustomerID        uuid.UUID         `json:"customer_id"`
	BillableMetricKey string            `json:"billable_metric_key"`
	EstimatedUnits    int64             `json:"estimated_units"`
	EstimatedCost     int64             `json:"estimated_cost"`
	Environment       Environment       `json:"environment"`
	Status            ReservationStatus `json:"status"`
	ExpiresAt         time.Time         `json:"expires_at"`
	Account           HoldAccount       `json:"account"`
	Metadata          Metadata          `json:"metadata"`
	CreatedAt         time.Time         `json:"created_at"`
}

// Create holds the estimated cost. Errors: 400 (both or neither customer
// ids, unknown strict external id, cross-tenant id), 422 (fields), 409
// insufficient-credits, 500 when the metric has no active rule (as the spec
// documents).
func (s *Reservations) Create(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ReserveInput) (ReserveResult, error) {
	hasID := in.CustomerID != nil && *in.CustomerID != ""
	hasExt := in.ExternalCustomerID != nil && *in.ExternalCustomerID != ""
	if hasID == hasExt {
		return ReserveResult{}, BadRequest("customer_id", "give exactly one of customer_id or external_customer_id")
	}
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return ReserveResult{}, Invalid("billable_metric_key", "billable_metric_key is required")
	}
	if in.EstimatedUnits == nil {
		return ReserveResult{}, Invalid("estimated_units", "estimated_units is required")
	}
	if *in.EstimatedUnits < 1 {
		return ReserveResult{}, Invalid("estimated_units", "estimated_units must be >= 1")
	}
	ttl := int64(DefaultReservationTTLSeconds)
	if in.TTLSeconds != nil {
		ttl = *in.TTLSeconds
		if ttl < 1 || ttl > MaxReservationTTLSeconds {
			return ReserveResult{}, Invalid("ttl_seconds", "ttl_seconds must be between 1 and 86400")
		}
	}
	if err := CheckLine("billable_metric_key", *in.BillableMetricKey); err != nil {
		return ReserveResult{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return ReserveResult{}, err
	}
	rule, err := s.ent.meteredRule(ctx, scope, *in.BillableMetricKey)
	if err != nil {
		if e, ok := AsError(err); ok && e.Kind == KindNotFound {
			return ReserveResult{}, DocumentedInternal("the metric has no active metering rule")
		}
		return ReserveResult{}, err
	}
	if _, err := Price(rule, *in.EstimatedUnits); err != nil {
		return ReserveResult{}, priceError(err, "estimated_units")
	}
	ref := CustomerRef{Value: derefString(in.CustomerID)}
	if hasExt {
		ref = CustomerRef{Value: *in.ExternalCustomerID, Strict: true}
	}
	c, err := s.ent.customers.Cached(ctx, scope, ref, !ref.Strict)
	if err != nil {
		if e, ok := AsError(err); ok && e.Kind == KindNotFound {
			return ReserveResult{}, BadRequest("external_customer_id", "no customer with this external_customer_id")
		}
		return ReserveResult{}, err
	}
	if err := s.ent.usageAllowed(ctx, c, rule.BillableMetricKey); err != nil {
		return ReserveResult{}, err
	}
	now := s.ent.clock.Now()
	cmd := ReserveCommand{OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key,
		RequestHash: idem.RequestHash, Now: now, ReservationID: uuid.Must(uuid.NewV7()), Metric: rule.BillableMetricKey,
		EstimatedUnits: *in.EstimatedUnits, Terms: TermsOf(rule), ExpiresAt: now.Add(time.Duration(ttl) * time.Second),
		Metadata: orEmpty(meta), Context: contextOf(c, tenant)}
	res, err := withLoad(ctx, s.ent.credits, cmd.Customer, func() (MutationResult, error) { return s.ent.hot.Reserve(ctx, cmd) })
	if err != nil {
		return ReserveResult{}, priceError(err, "estimated_units")
	}
	m := res.Mutation
	r := reservationOf(m)
	return ReserveResult{ID: r.ID, CustomerID: c.ID, BillableMetricKey: r.BillableMetricKey,
		EstimatedUnits: r.EstimatedUnits, EstimatedCost: r.EstimatedCost, Environment: c.Environment,
		Status: r.Status, ExpiresAt: r.ExpiresAt, Account: holdAccount(m), Metadata: r.Metadata, CreatedAt: r.CreatedAt}, nil
}

// CommitInput is the body of POST /v1/reservations/{id}/commit.
type CommitInput struct {
	ActualUnits *int64   `json:"actual_units"`
	Metadata    Metadata `json:"metadata"`
}

// HoldTransaction is the transaction member of commit and release bodies.
type HoldTransaction struct {
	ID                uuid.UUID  `json:"id"`
	CustomerID        *uuid.UUID `json:"customer_id,omitempty"`
	Delta             int64      `json:"delta"`
	Type              EntryType  `json:"type"`
	BillableMetricKey *string    `json:"billable_metric_key,omitempty"`
	CostUnits         *int64     `json:"cost_units,omitempty"`
	ReferenceID       *uuid.UUID `json:"reference_id,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
}

// CommitResult is the 200 body of a commit.
type CommitResult struct {
	ReservationID  uuid.UUID         `json:"reservation_id"`
	Status         ReservationStatus `json:"status"`
	EstimatedUnits int64             `json:"estimated_units"`
	ActualUnits    int64             `json:"actual_units"`
	EstimatedCost  int64             `json:"estimated_cost"`
	ActualCost     int64             `json:"actual_cost"`
	Released       int64             `json:"released"`
	Transaction    HoldTransaction   `json:"transaction"`
	Account        HoldAccount       `json:"account"`
}

// Commit settles a hold at the actual units, priced at the rule current now.
// Not environment scoped, but tenant scoped. Errors: 404, 409 (conflict,
// reservation-expired, insufficient-credits), 422.
func (s *Reservations) Commit(ctx context.Context, scope Scope, tenant Tenant, id uuid.UUID, idem Idempotency, in CommitInput) (CommitResult, error) {
	if in.ActualUnits == nil {
		return CommitResult{}, Invalid("actual_units", "actual_units is required")
	}
	if *in.ActualUnits < 0 {
		return CommitResult{}, Invalid("actual_units", "actual_units must be >= 0")
	}
	extra, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return CommitResult{}, err
	}
	c, hold, err := s.locate(ctx, scope, id)
	if err != nil {
		return CommitResult{}, err
	}
	holdScope := Scope{TenantID: c.TenantID, Environment: c.Environment}
	var terms RuleTerms
	if *in.ActualUnits > 0 {
		rule, found, err := s.ent.metering.ActiveRule(ctx, holdScope, hold.BillableMetricKey)
		if err != nil {
			return CommitResult{}, err
		}
		if !found {
			return CommitResult{}, DocumentedInternal("the metric has no active metering rule")
		}
		if _, err := Price(rule, *in.ActualUnits); err != nil {
			return CommitResult{}, priceError(err, "actual_units")
		}
		terms = TermsOf(rule)
	}
	meta := make(Metadata, len(hold.Metadata)+len(extra))
	for k, v := range hold.Metadata {
		meta[k] = v
	}
	for k, v := range extra {
		meta[k] = v
	}
	// The merge may pass a limit neither half did.
	if meta, err = meta.Canonical("metadata"); err != nil {
		return CommitResult{}, err
	}
	cmd := CommitCommand{OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key,
		RequestHash: idem.RequestHash, Now: s.ent.clock.Now(), ReservationID: id, ActualUnits: *in.ActualUnits,
		Terms: terms, Metadata: meta, Context: contextOf(c, tenant)}
	res, err := withLoad(ctx, s.ent.credits, cmd.Customer, func() (MutationResult, error) { return s.ent.hot.Commit(ctx, cmd) })
	if err != nil {
		return CommitResult{}, priceError(settled(err, hold), "actual_units")
	}
	m := res.Mutation
	r := reservationOf(m)
	out := CommitResult{ReservationID: id, Status: r.Status, EstimatedUnits: r.EstimatedUnits, EstimatedCost: r.EstimatedCost,
		Released: m.Reservation.Released, Account: holdAccount(m), Transaction: holdTransaction(m)}
	if r.ActualUnits != nil {
		out.ActualUnits = *r.ActualUnits
	}
	if r.ActualCost != nil {
		out.ActualCost = *r.ActualCost
	}
	return out, nil
}

// ReleaseResult is the 200 body of a release.
type ReleaseResult struct {
	ReservationID uuid.UUID         `json:"reservation_id"`
	Status        ReservationStatus `json:"status"`
	EstimatedCost int64             `json:"estimated_cost"`
	Released      int64             `json:"released"`
	Transaction   HoldTransaction   `json:"transaction"`
	Account       HoldAccount       `json:"account"`
}

// Release returns a hold, even past its expires_at. Errors: 404, 409.
func (s *Reservations) Release(ctx context.Context, scope Scope, tenant Tenant, id uuid.UUID, idem Idempotency) (ReleaseResult, error) {
	c, hold, err := s.locate(ctx, scope, id)
	if err != nil {
		return ReleaseResult{}, err
	}
	cmd := ReleaseCommand{OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key,
		RequestHash: idem.RequestHash, Now: s.ent.clock.Now(), ReservationID: id, Context: contextOf(c, tenant)}
	res, err := withLoad(ctx, s.ent.credits, cmd.Customer, func() (MutationResult, error) { return s.ent.hot.Release(ctx, cmd) })
	if err != nil {
		return ReleaseResult{}, settled(err, hold)
	}
	m := res.Mutation
	r := reservationOf(m)
	return ReleaseResult{ReservationID: id, Status: r.Status, EstimatedCost: r.EstimatedCost,
		Released: m.Reservation.Released, Transaction: holdTransaction(m), Account: holdAccount(m)}, nil
}

// Get reads a hold of the tenant, in either environment. Errors: 404.
func (s *Reservations) Get(ctx context.Context, scope Scope, id uuid.UUID) (Reservation, error) {
	_, hold, err := s.locate(ctx, scope, id)
	return hold, err
}

// List pages a customer's holds newest first; the customer is never created.
// An unrecognized status is the 500 the spec documents.
func (s *Reservations) List(ctx context.Context, scope Scope, ref CustomerRef, status, cursor string, limit int) (Page[Reservation], error) {
	if status != "" && !ReservationStatus(status).Valid() {
		return Page[Reservation]{}, DocumentedInternal("unrecognized reservation status filter: use active, committed, released or expired")
	}
	c, err := s.ent.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Page[Reservation]{}, err
	}
	s.ent.credits.awaitPersisted(ctx, CustomerKeyOf(c))
	return s.reader.ListReservations(ctx, c.ID, status, cursor, limit)
}

// locate finds a hold's customer (Redis index, else Postgres) and its
// persisted row, refusing other tenants' holds with a 404.
func (s *Reservations) locate(ctx context.Context, scope Scope, id uuid.UUID) (Customer, Reservation, error) {
	key, ok, err := s.ent.hot.ReservationCustomer(ctx, id)
	if err != nil {
		return Customer{}, Reservation{}, err
	}
	if !ok {
		key, err = s.reader.ReservationCustomer(ctx, id)
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
	s.ent.credits.awaitPersisted(ctx, key)
	hold, err := s.reader.GetReservation(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return Customer{}, Reservation{}, NotFound("reservation not found")
	}
	if err != nil {
		return Customer{}, Reservation{}, err
	}
	c, err := s.ent.customers.dir.CustomerByID(ctx, key.CustomerID)
	if err != nil {
		// A deleted customer's holds can still be settled.
		c = Customer{ID: key.CustomerID, TenantID: key.TenantID, Environment: key.Environment}
	}
	return c, hold, nil
}

func reservationOf(m Mutation) Reservation {
	r := m.Reservation
	if r == nil {
		return Reservation{}
	}
	out := Reservation{ID: r.ID, TenantID: m.TenantID, CustomerID: m.CustomerID, Environment: m.Environment,
		BillableMetricKey: r.Metric, EstimatedUnits: r.EstimatedUnits, EstimatedCost: r.EstimatedCost,
		ActualUnits: r.ActualUnits, ActualCost: r.ActualCost, Status: r.Status, ReferenceID: r.ID,
		ExpiresAt: time.UnixMilli(r.ExpiresMS).UTC(), CreatedAt: time.UnixMilli(r.CreatedMS).UTC(), Metadata: Metadata{}}
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
	return out
}

func holdAccount(m Mutation) HoldAccount {
	a := m.Account
	return HoldAccount{Balance: a.Balance, ReservedBalance: a.Reserved, EffectiveBalance: a.Balance - a.Reserved - a.Pending}
}

// holdTransaction summarizes a commit's or release's entries: the first
// main entry's id, the total delta.
func holdTransaction(m Mutation) HoldTransaction {
	var out HoldTransaction
	first := true
	for i, e := range m.Entries {
		if e.Role != RoleMain {
			continue
		}
		if first {
			out = HoldTransaction{ID: EntryID(m.OpID, i), Type: e.Type, ReferenceID: e.Ref, CreatedAt: m.At()}
			if e.Type == EntryConsumption {
				cid := m.CustomerID
				out.CustomerID, out.BillableMetricKey, out.CostUnits = &cid, e.Metric, e.Units
			}
			first = false
		}
		out.Delta += e.Delta
	}
	return out
}

// ReservationSweeper expires holds past their expires_at (interface.md:
// once per minute; the interval is configurable for tests).
type ReservationSweeper struct {
	Hot      HotStore
	Credits  *Credits
	Clock    Clock
	Interval time.Duration
	Log      zerolog.Logger
}

// Run sweeps every Interval (default one minute) until ctx ends.
func (s *ReservationSweeper) Run(ctx context.Context) {
	interval := s.Interval
	if interval <= 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.SweepOnce(ctx)
		}
	}
}

// SweepOnce expires every due hold; it returns how many it expired.
func (s *ReservationSweeper) SweepOnce(ctx context.Context) int {
	n := 0
	now := s.Clock.Now()
	for p := range sweepOrder(s.Credits.blocks.Partitions()) {
		due, err := s.Hot.DueReservations(ctx, p, now, 500)
		if err != nil {
			if ctx.Err() == nil {
				s.Log.Warn().Err(err).Int("partition", p).Msg("reservation sweep: list due")
			}
			continue
		}
		for _, d := range due {
			cmd := ReleaseCommand{OpID: uuid.Must(uuid.NewV7()), Customer: d.Customer, Now: now,
				ReservationID: d.ReservationID, Expire: true}
			_, err := withLoad(ctx, s.Credits, d.Customer, func() (MutationResult, error) { return s.Hot.Release(ctx, cmd) })
			if err == nil {
				n++
			} else if !errors.Is(err, ErrReservationNotActive) && !errors.Is(err, ErrReservationNotFound) {
				s.Log.Warn().Err(err).Str("reservation_id", d.ReservationID.String()).Msg("reservation sweep")
			}
		}
	}
	return n
}

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func hashHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// settled turns the store's "no such hold" into the 409 a finalized hold
// gets: Redis keeps finalized holds only briefly, Postgres keeps them (and
// locate waited for it to catch up).
func settled(err error, hold Reservation) error {
	if errors.Is(err, ErrReservationNotFound) && hold.Status != "" && hold.Status != ReservationActive {
		return ErrReservationNotActive
	}
	return err
}
