package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Clock is the one source of time (invariant 6): expiry, TTLs, sweeps and
// schedules read it, so tests can move time instead of waiting.
type Clock interface {
	Now() time.Time
}

// SystemClock reads the wall clock.
type SystemClock struct{}

// Now returns the current UTC time truncated to milliseconds, the precision
// every stored instant has.
func (SystemClock) Now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// CustomerKey names one customer's credit state.
type CustomerKey struct {
	TenantID    uuid.UUID
	Environment Environment
	CustomerID  uuid.UUID
}

// GrantCommand adds one block and its ledger entry to a customer's account.
type GrantCommand struct {
	OpID           uuid.UUID
	Customer       CustomerKey
	AccountID      uuid.UUID // used only when this grant creates the account
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	EntryType      EntryType
	Reason         *string
	EntryMetadata  Metadata
	// Block carries ID, OriginalAmount, Priority, Source, Metadata and, when
	// known up front, ExpiresAt; StartsAt and RemainingAmount are set by the store.
	Block Block
	// DurationSeconds is the block's lifetime from its start; used with StackAfter.
	DurationSeconds int64
	StackAfter      *StackAfter
	// Context is spliced into the Mutation for the events it owes.
	Context *MutationContext
	// AccumulationCap, when set, grants at most cap - balance (nothing at or
	// above it; the result is then a zero Mutation), atomically with the
	// balance read (plan grants' accumulation_cap).
	AccumulationCap *int64
}

// StackAfter starts a block when the latest-expiring block matching
// MetadataMatch ends.
type StackAfter struct {
	MetadataMatch Metadata `json:"metadata_match"`
	Fallback      string   `json:"fallback"`
}

// Stack-after fallbacks.
const (
	FallbackNow    = "now"
	FallbackReject = "reject"
)

// DebitCommand drains Amount from a customer's started blocks in spend order,
// one ledger entry per block it touches; it changes nothing when the
// effective balance is short.
type DebitCommand struct {
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	Amount         int64
	EntryType      EntryType
	Source         *Source
	Reason         *string
	EntryMetadata  Metadata
	// Context is spliced into the Mutation for the events it owes.
	Context *MutationContext
}

// MutationResult is what a money-moving script returns.
type MutationResult struct {
	Mutation Mutation
	// Replayed is true when the idempotency key had already been applied to
	// this customer and Mutation is the original one.
	Replayed bool
}

// BlockStore is the hot credit state (Redis, through Lua scripts). Every
// method on one customer is atomic. Methods return ErrStateMissing when the
// customer has no state in the store yet, so the caller loads it first.
type BlockStore interface {
	// Grant adds a block. Errors: ErrStackNoMatch, ErrOverflow,
	// ErrIdempotencyMismatch, ErrStateMissing.
	Grant(ctx context.Context, cmd GrantCommand) (MutationResult, error)
	// Debit drains blocks. Errors: ErrInsufficientCredits, ErrNoAccount,
	// ErrIdempotencyMismatch, ErrStateMissing.
	Debit(ctx context.Context, cmd DebitCommand) (MutationResult, error)
	// Expire records the expiry of every block of the customer whose
	// expires_at is at or before now; a no-op returns a zero Mutation.
	Expire(ctx context.Context, opID uuid.UUID, c CustomerKey, now time.Time) (MutationResult, bool, error)
	// Snapshot reads the account as of now (blocks past expires_at excluded
	// even before they are swept). Errors: ErrStateMissing.
	Snapshot(ctx context.Context, c CustomerKey, now time.Time) (Account, error)
	// Partitions is the fixed number of outbox partitions.
	Partitions() int
	// Load installs state rebuilt from Postgres unless the store already holds
	// this or a newer version (fencing, invariant 5); reports whether it wrote.
	Load(ctx context.Context, s AccountState) (bool, error)
}

// ExpiryIndex finds the customers the expiry sweep must visit: the system
// of record knows every block's expires_at, so Redis keeps no index of its
// own (issue 10: memory grows with customers, not with their blocks).
type ExpiryIndex interface {
	// DueExpiries lists up to limit customers with a block whose expires_at
	// fell in (since, now] and that held credit when last persisted, the
	// soonest expiry first.
	DueExpiries(ctx context.Context, since, now time.Time, limit int) ([]DueExpiry, error)
}

// DueExpiry is a customer with a block past its expires_at: ExpiresAt is
// its soonest such block's.
type DueExpiry struct {
	Customer  CustomerKey
	ExpiresAt time.Time
}

// BalanceReader is a BlockStore's lean read for checks: the balances of
// Snapshot without decoding, ordering or copying the blocks. Errors:
// ErrStateMissing.
type BalanceReader interface {
	// Balances are the account's figures as of now.
	Balances(ctx context.Context, c CustomerKey, now time.Time) (Balances, error)
}

// LedgerReader reads the system of record (Postgres).
type LedgerReader interface {
	// History pages a customer's ledger newest first.
	History(ctx context.Context, q HistoryQuery) (Page[LedgerEntry], error)
	// Overage sums overage per metric in [from, to).
	Overage(ctx context.Context, customer uuid.UUID, from, to time.Time) ([]OverageLine, error)
	// AccountState reads what a rebuild needs; ok is false when the customer
	// never had an account.
	AccountState(ctx context.Context, c CustomerKey, appliedSince time.Time) (s AccountState, ok bool, err error)
}

// UsageReader reads the hourly usage rollup (Postgres, migration 020).
type UsageReader interface {
	// UsageRows sums q's hours into its buckets, per metric: sorted by
	// metric key (bytewise), then bucket start; buckets with no usage are
	// absent.
	UsageRows(ctx context.Context, q UsageQuery) ([]UsageRow, error)
}

// HistoryQuery filters a customer's ledger.
type HistoryQuery struct {
	CustomerID        uuid.UUID
	Type              *EntryType
	Source            *Source
	BillableMetricKey *string
	From, To          *time.Time
	Cursor            string
	Limit             int
}

// Directory stores tenants, keys and customers (Postgres).
type Directory interface {
	CreateTenant(ctx context.Context, t Tenant) error
	GetTenant(ctx context.Context, id uuid.UUID) (Tenant, error)
	UpdateTenant(ctx context.Context, t Tenant) error
	CreateAPIKey(ctx context.Context, k APIKey, hash []byte) error
	// APIKeyByHash finds a live (unrevoked) key by the SHA-256 of its text.
	APIKeyByHash(ctx context.Context, hash []byte) (APIKey, error)
	RevokeAPIKey(ctx context.Context, tenant, key uuid.UUID, at time.Time) error
	// ListTenants reads up to limit tenants whose id sorts after the
	// cursor (uuid.Nil: from the start), in id order.
	ListTenants(ctx context.Context, after uuid.UUID, limit int) ([]Tenant, error)
	// ListAPIKeys reads every key of tenant, revoked ones included, oldest
	// first, without their text.
	ListAPIKeys(ctx context.Context, tenant uuid.UUID) ([]APIKey, error)

	// CreateCustomer inserts c; ErrExternalIDTaken when the external id is in use.
	CreateCustomer(ctx context.Context, c Customer) error
	// UpdateCustomer writes every mutable field of c.
	UpdateCustomer(ctx context.Context, c Customer) error
	// DeleteCustomer soft-deletes; ErrNotFound when already gone.
	DeleteCustomer(ctx context.Context, s Scope, id uuid.UUID, at time.Time) error
	// CustomerByExternalID finds a live customer in scope.
	CustomerByExternalID(ctx context.Context, s Scope, externalID string) (Customer, error)
	// CustomerByID finds a live customer by id in any tenant, so callers can
	// tell "other tenant" from "unknown".
	CustomerByID(ctx context.Context, id uuid.UUID) (Customer, error)
	// ListCustomers pages live customers newest first, matching search in
	// external_id or display_name when non-empty.
	ListCustomers(ctx context.Context, s Scope, search, cursor string, limit int) (Page[Customer], error)
}

// OutboxMessage is one outbox stream entry and the Mutation it carries.
type OutboxMessage struct {
	ID       string
	Mutation Mutation
}

// Outbox is the Redis side of the persister: the partitioned streams the
// Lua scripts append to.
type Outbox interface {
	// Partitions is the fixed number of outbox partitions.
	Partitions() int
	// Read returns up to count messages of partition p for consumer: first
	// the ones already delivered to it and not acknowledged (a restart
	// resumes them), then new ones, waiting up to block for some.
	Read(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]OutboxMessage, error)
	// Claim takes over messages of partition p idle for at least minIdle in
	// other consumers (a creditd that died).
	Claim(ctx context.Context, p int, consumer string, minIdle time.Duration, count int) ([]OutboxMessage, error)
	// Ack acknowledges and deletes messages once they are committed.
	Ack(ctx context.Context, p int, ids []string) error
	// Backlog reports the unacknowledged or unread messages of partition p:
	// how many, and the Unix ms of the oldest (0 when none).
	Backlog(ctx context.Context, p int) (count int64, oldestMS int64, err error)
}

// LedgerWriter is the Postgres side of the persister.
type LedgerWriter interface {
	// Apply writes mutations in one transaction, idempotently: entries and
	// operations already present are skipped, and account and block rows
	// move only forward in version.
	Apply(ctx context.Context, ms []Mutation) error
}

// RebuildSource pages every account Postgres holds, for creditd rebuild.
type RebuildSource interface {
	// AccountStates returns up to limit accounts with customer id greater
	// than after, ordered by customer id.
	AccountStates(ctx context.Context, after uuid.UUID, limit int, appliedSince time.Time) ([]AccountState, error)
	// CountAccounts is the total, for the progress display.
	CountAccounts(ctx context.Context) (int64, error)
	// AccountIDCuts is up to parts-1 customer ids, ascending, that cut the
	// accounts into parts of about equal count: the rebuild's parallel
	// readers start at them (ids are time-ordered, so an even split of the
	// id space would leave most accounts to one reader).
	AccountIDCuts(ctx context.Context, parts int) ([]uuid.UUID, error)
}

// IdemRecord is the HTTP idempotency record of one key, as Begin finds it
// and Finish stores it.
type IdemRecord struct {
	// Mismatch: the record was written for another request hash (a key
	// reused with another method, path, body or environment). Set by Begin.
	Mismatch bool
	// Done: the request ran to its final answer; false while it runs.
	Done bool
	// Rerun: done, and no response is stored because running the endpoint
	// again answers byte for byte the same: the money scripts remember the
	// operation under its own op key and replay it.
	Rerun bool
	// Status, ContentType and Body are the stored response (Done, not Rerun).
	Status      int
	ContentType string
	Body        []byte
}

// RerunMark is one claim to finish with the rerun mark (MarkRerun).
type RerunMark struct {
	Tenant      uuid.UUID
	Key         string
	RequestHash string
	// Held: the claim certainly still stands (Finish's held).
	Held bool
}

// IdempotencyRecords stores HTTP idempotency records, scoped by tenant and
// key value alone (interface.md Common rules 1).
type IdempotencyRecords interface {
	// Begin claims key for a request whose fingerprint is requestHash. When
	// no record exists it writes an in-progress one that lapses after lockTTL
	// (so a crashed claimer's retry can run again) and returns claimed=true.
	// Otherwise it returns the existing record and claimed=false.
	Begin(ctx context.Context, tenant uuid.UUID, key, requestHash string, lockTTL time.Duration) (rec IdemRecord, claimed bool, err error)
	// Finish stores rec as requestHash's final answer for ttl (24 h). It
	// never replaces a record of another request hash nor a finished one;
	// held tells it the caller's claim certainly still stands (taken well
	// within its lock TTL), so no other record can be there to protect.
	Finish(ctx context.Context, tenant uuid.UUID, key, requestHash string, rec IdemRecord, ttl time.Duration, held bool) error
	// MarkRerun finishes many claims with the rerun mark (IdemRecord.Rerun)
	// for ttl in one round trip where it can; each mark as Finish would. It
	// returns the first error; the other marks are still written.
	MarkRerun(ctx context.Context, marks []RerunMark, ttl time.Duration) error
	// Abort drops an in-progress record of requestHash (the request changed
	// nothing, so a retry must run afresh).
	Abort(ctx context.Context, tenant uuid.UUID, key, requestHash string) error
}

// RateDecision is one take from an API key's rate budget (a lease of one or
// more requests) and the figures of the RateLimit headers (addendum 10).
type RateDecision struct {
	Allowed bool
	// Granted is the requests the take spent (0 when refused): the ones
	// asked for, or fewer when only those fitted.
	Granted int
	// Limit is the burst: the most requests the budget holds.
	Limit int
	// Remaining is the whole requests left in the budget after this take.
	Remaining int
	// Reset is the time until the budget is full again.
	Reset time.Duration
	// RetryAfter is the time until one request is allowed (refused only).
	RetryAfter time.Duration
}

// RateBudgets keeps the per-API-key rate budgets that every creditd node
// shares, so N nodes together allow a key its rate once, not N times.
type RateBudgets interface {
	// TakeRate spends up to requests (at least 1) of key's budget
	// (tenant's, refilled at perSecond up to burst, both at least 1): all
	// of them when they fit, else as many as fit, else none (refused). A
	// node serves the ones granted beyond the first from memory (a lease).
	// A zero now reads the store's own clock, the one clock every node
	// agrees on; tests pass a fake one.
	TakeRate(ctx context.Context, tenant, key uuid.UUID, perSecond, burst, requests int, now time.Time) (RateDecision, error)
}

// DeliverySlots caps one tenant's webhook attempts in flight across every
// node that shares them (lua.Store: a set of leased slots in Redis), so a
// slow endpoint holds the same number of attempts however many nodes run.
type DeliverySlots interface {
	// AcquireDeliverySlot takes one of tenant's limit slots for holder
	// until lease has passed (a crashed node's slot frees itself); false
	// when all are held. A holder that holds one renews it.
	AcquireDeliverySlot(ctx context.Context, tenant, holder uuid.UUID, limit int, lease time.Duration) (bool, error)
	// ReleaseDeliverySlot gives holder's slot back.
	ReleaseDeliverySlot(ctx context.Context, tenant, holder uuid.UUID) error
}
