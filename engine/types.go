// Package engine holds creditd's domain: tenants, customers, credit blocks,
// ledger entries and the rules that move money between them. It declares the
// small interfaces it needs (BlockStore, Ledger, Directory, Clock) and never
// imports the packages that implement them (lua/, persist/) nor the API.
package engine

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Environment is the world an API key selects: live or sandbox.
type Environment string

// Environments a key can select.
const (
	EnvironmentLive    Environment = "live"
	EnvironmentSandbox Environment = "sandbox"
)

// Valid reports whether e is one of the two environments.
func (e Environment) Valid() bool { return e == EnvironmentLive || e == EnvironmentSandbox }

// OveragePolicy says what happens when usage outruns the balance.
type OveragePolicy string

// Overage policies of docs/spec/interface.md "General conventions".
const (
	OveragePolicyBlock  OveragePolicy = "block"
	OveragePolicyAllow  OveragePolicy = "allow"
	OveragePolicyNotify OveragePolicy = "notify"
)

// Valid reports whether p is a known policy.
func (p OveragePolicy) Valid() bool {
	return p == OveragePolicyBlock || p == OveragePolicyAllow || p == OveragePolicyNotify
}

// Source is where credit came from (grant sources and ledger sources).
type Source string

// Sources of docs/spec/interface.md "Ledger entry".
const (
	SourcePlanGrant    Source = "plan_grant"
	SourceTopup        Source = "topup"
	SourcePromotional  Source = "promotional"
	SourceCompensation Source = "compensation"
	SourceReferral     Source = "referral"
	SourceManual       Source = "manual"
	SourceMigration    Source = "migration"
)

// ValidGrantSource reports whether s may be named by a grant or adjust call.
func (s Source) ValidGrantSource() bool {
	switch s {
	case SourcePromotional, SourceCompensation, SourceReferral, SourceManual, SourceMigration:
		return true
	}
	return false
}

// EntryType is the kind of a ledger entry.
type EntryType string

// Ledger entry types of docs/spec/interface.md "Ledger entry".
const (
	EntryPlanGrant   EntryType = "plan_grant"
	EntryTopup       EntryType = "topup"
	EntryConsumption EntryType = "consumption"
	EntryReservation EntryType = "reservation"
	EntryRelease     EntryType = "release"
	EntryExpiry      EntryType = "expiry"
	EntryAdjustment  EntryType = "adjustment"
	// EntryDebtRepayment is a fresh block paying the debt of the credit
	// line: a zero delta whose one draw is what the block paid.
	EntryDebtRepayment EntryType = "debt_repayment"
	// EntryPoolDraw is a parent's credit paying a child's charge (shared
	// pools): a debit of the parent whose reference is the child.
	EntryPoolDraw EntryType = "pool_draw"
)

// Valid reports whether t is a known entry type.
func (t EntryType) Valid() bool {
	switch t {
	case EntryPlanGrant, EntryTopup, EntryConsumption, EntryReservation, EntryRelease, EntryExpiry, EntryAdjustment,
		EntryDebtRepayment, EntryPoolDraw:
		return true
	}
	return false
}

// Metadata is a free-form JSON object; values stay raw so numbers keep their
// exact text and merging is key by key. Input metadata passes Canonical
// (engine/metadata.go) before it goes anywhere: limits and one encoding.
type Metadata map[string]json.RawMessage

// Tenant is one developer account.
type Tenant struct {
	ID                           uuid.UUID     `json:"id"`
	Name                         string        `json:"name"`
	DefaultOveragePolicy         OveragePolicy `json:"default_overage_policy"`
	DefaultLowBalanceThresholdMC int64         `json:"default_low_balance_threshold_mc"`
	WebhookURL                   *string       `json:"webhook_url"`
	WebhookSecret                *string       `json:"-"`
	RateLimitPerSecond           int           `json:"rate_limit_per_second"`
	RateLimitBurst               int           `json:"rate_limit_burst"`
	CreatedAt                    time.Time     `json:"created_at"`
	UpdatedAt                    time.Time     `json:"updated_at"`
}

// Scope is what an API key grants: one tenant in one environment.
type Scope struct {
	TenantID    uuid.UUID
	Environment Environment
	KeyID       uuid.UUID
}

// APIKey is a stored key; the plain text exists only at creation.
type APIKey struct {
	ID          uuid.UUID   `json:"id"`
	TenantID    uuid.UUID   `json:"tenant_id"`
	Environment Environment `json:"environment"`
	// Key is the plain key, filled only in the response that creates it.
	Key       string     `json:"key,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Customer is one customer of a tenant.
type Customer struct {
	ID                    uuid.UUID      `json:"id"`
	TenantID              uuid.UUID      `json:"tenant_id"`
	Environment           Environment    `json:"environment"`
	ExternalID            string         `json:"external_id"`
	DisplayName           *string        `json:"display_name"`
	OveragePolicy         *OveragePolicy `json:"overage_policy"`
	LowBalanceThresholdMC *int64         `json:"low_balance_threshold_mc"`
	// CreditLimitMC is the credit line, millicredits >= 0 (0: none): under
	// policy block the effective balance may go down to minus it
	// (docs/rules.md "Credit line").
	CreditLimitMC int64 `json:"credit_limit_mc"`
	// Budgets are the customer's spend caps per period (docs/rules.md
	// "Budgets"); never nil once read.
	Budgets []Budget `json:"budgets"`
	// ParentID is the customer whose credit this one spends once its own
	// is gone (docs/rules.md "Shared pools"); nil: none. ParentDrawLimit
	// caps what it draws from the parent per period; nil: no cap.
	ParentID        *uuid.UUID `json:"parent_id"`
	ParentDrawLimit *DrawLimit `json:"parent_draw_limit"`
	Metadata        Metadata   `json:"metadata"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`
	DeletedAt       *time.Time `json:"-"`
}

// Block is one credit block: an amount granted at once, spent down over time.
type Block struct {
	ID              uuid.UUID  `json:"id"`
	CustomerID      uuid.UUID  `json:"customer_id"`
	OriginalAmount  int64      `json:"original_amount"`
	RemainingAmount int64      `json:"remaining_amount"`
	Source          Source     `json:"source"`
	Priority        int        `json:"priority"`
	StartsAt        time.Time  `json:"starts_at"`
	ExpiresAt       *time.Time `json:"expires_at"`
	CreatedAt       time.Time  `json:"created_at"`
	Metadata        Metadata   `json:"metadata"`
	// AppliesTo is the block's scope, nil for every metric.
	AppliesTo *AppliesTo `json:"applies_to"`
}

// Account is a customer's balance snapshot.
type Account struct {
	// ID is empty when no account exists yet (no money ever moved).
	ID               string      `json:"id"`
	TenantID         uuid.UUID   `json:"tenant_id"`
	CustomerID       uuid.UUID   `json:"customer_id"`
	Environment      Environment `json:"environment"`
	Balance          int64       `json:"balance"`
	ReservedBalance  int64       `json:"reserved_balance"`
	PendingBalance   int64       `json:"pending_balance"`
	EffectiveBalance int64       `json:"effective_balance"`
	LifetimeEarned   int64       `json:"lifetime_earned"`
	// DebtMC is what the account owes on its credit line, counted in
	// Balance (docs/rules.md "Credit line").
	DebtMC int64 `json:"debt_mc"`
	// ReservationMetrics are the distinct metrics of the active reservations when some
	// block has a scope (ScopeFree), else nil; never in an answer.
	ReservationMetrics []string `json:"-"`
	// CreditLimitMC is the customer's credit line (Customer.CreditLimitMC).
	CreditLimitMC int64 `json:"credit_limit_mc"`
	// Budgets are the customer's budgets with their spend in the current
	// period (docs/rules.md "Budgets"); absent when it has none, and from
	// an answer as_of a past instant.
	Budgets []BudgetStatus `json:"budgets,omitempty"`
	// ParentID is the parent whose credit the customer spends once its own
	// is gone, and ParentDraw its draw limit with what it drew in the
	// current period (docs/rules.md "Shared pools"); absent without one.
	ParentID   *uuid.UUID       `json:"parent_id,omitempty"`
	ParentDraw *DrawLimitStatus `json:"parent_draw_limit,omitempty"`
	// AsOf is the past instant the figures are of (GET .../credits?as_of=,
	// Credits.AccountAsOf); nil for the current account.
	AsOf      *time.Time `json:"as_of,omitempty"`
	Version   int64      `json:"version"`
	UpdatedAt time.Time  `json:"updated_at"`
	Blocks    []Block    `json:"blocks"`
	// ByScope breaks the live blocks down by scope (GET .../credits?
	// by_scope=true, ScopeBalances); absent unless asked for.
	ByScope []ScopeBalance `json:"by_scope,omitempty"`
}

// LedgerEntry is one append-only ledger row.
type LedgerEntry struct {
	ID                uuid.UUID   `json:"id"`
	TenantID          uuid.UUID   `json:"tenant_id"`
	CustomerID        uuid.UUID   `json:"customer_id"`
	Environment       Environment `json:"environment"`
	Delta             int64       `json:"delta"`
	Type              EntryType   `json:"type"`
	Source            *Source     `json:"source"`
	CreditBlockID     *uuid.UUID  `json:"credit_block_id,omitempty"`
	BillableMetricKey *string     `json:"billable_metric_key,omitempty"`
	CostUnits         *int64      `json:"cost_units,omitempty"`
	ExchangeRate      *int64      `json:"exchange_rate,omitempty"`
	IdempotencyKey    string      `json:"idempotency_key"`
	ReferenceID       *uuid.UUID  `json:"reference_id,omitempty"`
	Reason            *string     `json:"reason,omitempty"`
	Metadata          Metadata    `json:"metadata"`
	CreatedAt         time.Time   `json:"created_at"`
	// Draws lists what each block paid when one debit drained several
	// (CreditBlockID is then absent); empty for an entry of one block.
	Draws []LedgerDraw `json:"draws,omitempty"`
}

// LedgerDraw is what one credit block paid towards a ledger entry.
type LedgerDraw struct {
	CreditBlockID uuid.UUID `json:"credit_block_id"`
	// Amount is the positive amount, in millicredits, the block paid.
	Amount int64 `json:"amount"`
}

// OverageLine is the overage of one metric in a window.
type OverageLine struct {
	BillableMetricKey string `json:"billable_metric_key"`
	OverageMC         int64  `json:"overage_mc"`
}

// Page is one page of a cursor-paged list.
type Page[T any] struct {
	Data       []T
	HasMore    bool
	NextCursor string
}
