// The ports: every interface engine declares for what it needs from
// outside (Redis in lua/, Postgres in persist/, the clock, the webhook
// sender), in one file and nothing else in it, so a newcomer finds each one
// and its contract in one place. The one exception is the HTTP idempotency
// record's port, idempotency.Records (engine/idempotency/records.go): it
// lives in the idempotency room with the rest of that concern. The values
// the ports carry live with their concept (commands.go: GrantCommand,
// DebitCommand, MutationResult; door.go: RateDecision; clock.go; and so
// on). It is long because there are many ports, not because any holds
// logic.

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

// BalanceReader is a BlockStore's lean read for checks: the balances of
// Snapshot without decoding, ordering or copying the blocks. Errors:
// ErrStateMissing.
type BalanceReader interface {
	// Balances are the account's figures as of now.
	Balances(ctx context.Context, c CustomerKey, now time.Time) (Balances, error)
}

// ForkRepairStore is what a fork repair (RepairFork) needs of the hot
// store: the money scripts and a load of a customer it has no state for.
type ForkRepairStore interface {
	Grant(ctx context.Context, cmd GrantCommand) (MutationResult, error)
	Debit(ctx context.Context, cmd DebitCommand) (MutationResult, error)
	Consume(ctx context.Context, cmd ConsumeCommand) (MutationResult, error)
	Commit(ctx context.Context, cmd CommitCommand) (MutationResult, error)
	Load(ctx context.Context, s AccountState) (bool, error)
}

// LedgerReader reads the system of record (Postgres).
type LedgerReader interface {
	// History pages a customer's ledger newest first.
	History(ctx context.Context, q HistoryQuery) (Page[LedgerEntry], error)
	// Overage sums customer c's overage per metric in [from, to).
	Overage(ctx context.Context, c CustomerKey, from, to time.Time) ([]OverageLine, error)
	// AccountAt reads the customer's figures at instant at from the ledger,
	// reading at most maxEntries ledger entries on either side of it;
	// ErrAsOfTooFar when both sides hold more.
	AccountAt(ctx context.Context, c CustomerKey, at time.Time, maxEntries int) (PastAccount, error)
	AccountReader
}

// AccountReader reads one customer's account as Postgres holds it: what a
// load, a reload and a reconcile start from.
type AccountReader interface {
	// AccountState reads what a rebuild needs; ok is false when the customer
	// never had an account.
	AccountState(ctx context.Context, c CustomerKey, appliedSince time.Time) (s AccountState, ok bool, err error)
}

// AccountPages pages every account Postgres holds by customer id: the
// rebuild and the reconcile pass both walk them.
type AccountPages interface {
	// AccountStates returns up to limit accounts with customer id greater
	// than after, ordered by customer id.
	AccountStates(ctx context.Context, after uuid.UUID, limit int, appliedSince time.Time) ([]AccountState, error)
}

// UsageReader reads the hourly usage rollup (Postgres, migration 020).
type UsageReader interface {
	// UsageRows sums q's hours into its buckets, per metric: sorted by
	// metric key (bytewise), then bucket start; buckets with no usage are
	// absent.
	UsageRows(ctx context.Context, q UsageQuery) ([]UsageRow, error)
}

// Directory stores tenants, keys and customers (Postgres).
type Directory interface {
	CreateTenant(ctx context.Context, t Tenant) error
	TenantReader
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
	// HasChildren reports whether a live customer of scope names id as
	// its parent (shared pools are one level deep).
	HasChildren(ctx context.Context, s Scope, id uuid.UUID) (bool, error)
	// ListCustomers pages live customers newest first, matching search in
	// external_id or display_name when non-empty.
	ListCustomers(ctx context.Context, s Scope, search, cursor string, limit int) (Page[Customer], error)
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

// OutboxLeases hands each outbox partition to one persister of a fleet at
// a time (issue 25): only a partition's owner reads it, so one customer's
// entries are applied in stream order whichever node runs them. A lease
// lapses ttl after its last take or renewal, so a dead owner's partitions
// go to the survivors; every take has a fencing token, greater than any
// earlier one of the partition, which the persister's transaction checks
// in Postgres so a stalled ex-owner cannot commit after its successor.
type OutboxLeases interface {
	// TakePartition makes consumer the owner of partition p for ttl when
	// no one else holds it (a lease under consumer's own name is from an
	// earlier run of it and is taken again); it returns the new fencing
	// token, and ok false when another consumer owns p.
	TakePartition(ctx context.Context, p int, consumer string, ttl time.Duration) (token int64, ok bool, err error)
	// RenewPartition extends consumer's lease of p taken with token to
	// ttl from now; false when the lease is no longer that one.
	RenewPartition(ctx context.Context, p int, consumer string, token int64, ttl time.Duration) (bool, error)
	// ReleasePartition ends consumer's lease of p taken with token (nothing
	// when the lease is no longer that one).
	ReleasePartition(ctx context.Context, p int, consumer string, token int64) error
	// PartitionOwners lists the consumer owning each partition ("" for
	// none), indexed by partition.
	PartitionOwners(ctx context.Context) ([]string, error)
	// Persisters announces consumer as a live persister for ttl (leave 0:
	// withdraws it) and returns how many are live, itself included.
	Persisters(ctx context.Context, consumer string, ttl time.Duration) (int, error)
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
	AccountPages
	// CountAccounts is the total, for the progress display.
	CountAccounts(ctx context.Context) (int64, error)
	// AccountIDCuts is up to parts-1 customer ids, ascending, that cut the
	// accounts into parts of about equal count: the rebuild's parallel
	// readers start at them (ids are time-ordered, so an even split of the
	// id space would leave most accounts to one reader).
	AccountIDCuts(ctx context.Context, parts int) ([]uuid.UUID, error)
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

// ChangeStamps keeps the fleet's change stamps (issue 25, lua.Store: one
// small hash per tenant in Redis): per tenant and StampKind, a number that
// only grows, moved by every write that changes what a node caches of that
// kind, before the write answers. A node reads its tenant's stamps once per
// request and drops what it cached under older ones (Stamps), so a change
// made on one node governs the next request on every node (invariant 15).
type ChangeStamps interface {
	// StampsRead is tenant's stamps, one per kind (0 where never moved).
	StampsRead(ctx context.Context, tenant uuid.UUID) (TenantStamps, error)
	// StampBump moves tenant's stamp of kind past every value it had and
	// returns the new value.
	StampBump(ctx context.Context, tenant uuid.UUID, kind StampKind) (uint64, error)
}

// ChangeFeed is the tenants' config changes in order (issue 27, lua.Store:
// a capped stream per tenant that every ChangeStamps bump of a Fed kind
// appends to in the same script).
type ChangeFeed interface {
	// ChangesAfter lists up to limit of tenant's changes after cursor,
	// oldest first; lost reports that some after cursor are no longer kept
	// (trimmed, or lost with the store), and then lists none.
	ChangesAfter(ctx context.Context, tenant uuid.UUID, after ChangeID, limit int) (changes []ConfigChange, lost bool, err error)
	// ChangesLast is the id of tenant's newest change (zero for none).
	ChangesLast(ctx context.Context, tenant uuid.UUID) (ChangeID, error)
}

// ReservationNotes appends reservation notices to the tenants' change feeds (issue 27,
// lua.Store; NotingReservations writes them).
type ReservationNotes interface {
	// ReservationNote appends a notice that a reservation of customer c changed.
	ReservationNote(ctx context.Context, c CustomerKey) error
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

// AlertStore keeps alert configurations (Postgres).
type AlertStore interface {
	// AlertSettingsGet returns the customer's own settings (customer nil:
	// the tenant default of the scope's environment); ok false when none.
	AlertSettingsGet(ctx context.Context, s Scope, customer *uuid.UUID) (StoredAlerts, bool, error)
	// AlertSettingsPut replaces them.
	AlertSettingsPut(ctx context.Context, s Scope, customer *uuid.UUID, settings AlertSettings, now time.Time) error
	// AlertSettingsDelete removes the customer's own settings; ok false
	// when it had none.
	AlertSettingsDelete(ctx context.Context, s Scope, customer uuid.UUID) (bool, error)
}

// CustomerResolver finds a customer of a scope by id or external id.
type CustomerResolver interface {
	Resolve(ctx context.Context, scope Scope, ref CustomerRef, create bool) (Customer, error)
}

// KeyLookup turns the SHA-256 of a presented API key into what it
// authenticates, on every request; CachedKeys caches it, NewKeyLookup
// reads a Directory.
type KeyLookup interface {
	// KeyScope is the scope (tenant, environment, key id) and tenant of the
	// live key hashed to sum; ErrNotFound when no live key has that hash.
	KeyScope(ctx context.Context, sum [32]byte) (Scope, Tenant, error)
}

// CustomerLookup is how the hot path finds customers (checks, consumes,
// reservations); CachedCustomers caches it, *Customers reads the directory.
type CustomerLookup interface {
	CustomerResolver
	// CustomerByKey is the customer of key; ErrNotFound when the directory
	// has no live customer there.
	CustomerByKey(ctx context.Context, key CustomerKey) (Customer, error)
}

// AppliedOps finds operations Postgres holds by idempotency key, for the
// money calls to answer a retry whose op key Redis no longer holds
// (invariant 4, forever).
type AppliedOps interface {
	// AppliedOps returns, for each ref, the persisted Mutation of that
	// customer under that key and whether there is one. Safe for
	// concurrent use; concurrent calls may share one query.
	AppliedOps(ctx context.Context, refs []OpRef) ([]Mutation, []bool, error)
}

// OpRecords lets the persister record the idempotency keys of operations
// it has committed in the seen filter and shorten their op keys to
// idempotency.OpKeyGrace.
type OpRecords interface {
	// ForgetOps records and shortens the op keys of ms (outbox partition
	// p) that carry an idempotency key. Call it only after ms are
	// committed.
	ForgetOps(ctx context.Context, p int, ms []Mutation) error
}

// SeenFilter is the seen filter's seeding side (SeenSeeder): a partition
// whose filter was never seeded from Postgres (a first start, or a Redis
// that lost its data) sends every money call with an absent op key to
// Postgres.
type SeenFilter interface {
	// SeenSeeded returns, per filter, the instant it was last seeded
	// from; zero for one never seeded. The filters are the outbox
	// partitions', then the usage index's (UsageIDs): a usage filter
	// knows the event ids of every customer of its slot.
	SeenSeeded(ctx context.Context) ([]time.Time, error)
	// SeedSeen records refs in their filters (a usage event's key in its
	// partition's and its usage slot's); with done it then marks parts
	// (SeenSeeded's numbering) seeded from the instant from.
	SeedSeen(ctx context.Context, refs []OpRef, parts []int, from time.Time, done bool) error
}

// AppliedKeys reads the idempotency keys of the operations Postgres holds,
// for seeding the seen filter.
type AppliedKeys interface {
	// AppliedKeysSince streams the keys of the operations created at or
	// after since to fn, at most page at a time, in one read; an error
	// from fn ends it.
	AppliedKeysSince(ctx context.Context, since time.Time, page int, fn func([]OpRef) error) error
}

// Catalog stores billable metrics and metering rules (Postgres).
type Catalog interface {
	// CreateMetric inserts m; a Conflict error when the key exists.
	CreateMetric(ctx context.Context, m BillableMetric) error
	// GetMetric finds a metric by key in scope (ErrNotFound).
	GetMetric(ctx context.Context, s Scope, key string) (BillableMetric, error)
	// UpdateMetric writes m's mutable fields.
	UpdateMetric(ctx context.Context, m BillableMetric) error
	// ListMetrics pages metrics oldest first.
	ListMetrics(ctx context.Context, s Scope, cursor string, limit int) (Page[BillableMetric], error)
	// AllMetrics lists every metric in scope (bounded).
	AllMetrics(ctx context.Context, s Scope) ([]BillableMetric, error)
	// CreateRule ends the active rule of the key and inserts r in one
	// transaction, creating metricIfMissing when the key has no metric.
	CreateRule(ctx context.Context, r MeteringRule, metricIfMissing BillableMetric) error
	// ListRules pages rules oldest first.
	ListRules(ctx context.Context, s Scope, metricKey string, activeOnly bool, cursor string, limit int) (Page[MeteringRule], error)
	// ActiveRule is the rule with no effective_until (ErrNotFound).
	ActiveRule(ctx context.Context, s Scope, metricKey string) (MeteringRule, error)
}

// CatalogLookup is the hot path's read of the catalogue (every check,
// consume and reservation); CachedCatalog caches it, NewCatalogLookup reads a
// Catalog.
type CatalogLookup interface {
	// Metric finds the metric of key in scope; ok is false when none exists.
	Metric(ctx context.Context, s Scope, key string) (m BillableMetric, ok bool, err error)
	// Rule finds the active rule of key in scope; ok is false when none
	// exists.
	Rule(ctx context.Context, s Scope, key string) (r MeteringRule, ok bool, err error)
}

// OutboxMarks tells how far the persister has moved the outbox into
// Postgres (lua), so a read Postgres answers can wait for the writes
// acknowledged before it (WrittenBehind).
type OutboxMarks interface {
	// OutboxMark is the newest entry of customer's outbox partition, or of
	// every partition when customer is nil.
	OutboxMark(ctx context.Context, customer *uuid.UUID) (OutboxMark, error)
	// OutboxPersisted reports whether every entry up to mark has left the
	// outbox (committed to Postgres, or set aside as a dead letter).
	OutboxPersisted(ctx context.Context, mark OutboxMark) (bool, error)
}

// PlanView tells the entitlement service what a customer's subscription
// grants; until subscriptions exist, every value is the metric default.
type PlanView interface {
	// ForCustomer returns the facts of the customer's live subscription, or
	// nil when it has none. Implementations cache (the hot path calls it).
	ForCustomer(ctx context.Context, c Customer) (*SubscriptionFacts, error)
}

// UsageIDs is the tenant index of usage event ids in Redis (issue 26): a
// claim per (tenant, environment, event id) naming the customer the event
// is charged to, so an event_id re-sent for another customer is told
// apart before Postgres holds the first charge
// (idempotency.UsageClaimRetention says how long a claim lives).
type UsageIDs interface {
	// UsageIDsClaim claims each claim's event id of tenant and env for its
	// customer (or only looks, LookOnly), in one pipelined round trip;
	// holds[i] says what claims[i] found (errs[i] non-nil: nothing is
	// known, nothing was claimed). Safe for concurrent use.
	UsageIDsClaim(ctx context.Context, tenant uuid.UUID, env Environment, claims []UsageClaim) (holds []UsageHold, errs []error)
	// UsageIDsRelease gives back claims taken by UsageIDsClaim whose
	// events did not apply, in one pipelined round trip: a claim goes
	// when no other send of its customer still holds it. Best effort: a
	// claim it fails to release lapses after UsageClaimRetention.
	UsageIDsRelease(ctx context.Context, tenant uuid.UUID, env Environment, claims []UsageClaim) error
}

// UsageClaim is one event id claimed for a customer (UsageIDs).
type UsageClaim struct {
	EventID  string
	Customer uuid.UUID
	// LookOnly asks what holds the id without claiming it (an event that
	// runs no consume): Other and Holder name any holder, this customer
	// or another; Fresh is never set.
	LookOnly bool
}

// UsageHold is what a claim of an event id found (UsageIDs).
type UsageHold struct {
	// Other is true when another customer holds the id: the event is a
	// reuse of an id charged (or being charged) to Holder.
	Other  bool
	Holder uuid.UUID
	// Fresh is true when the claim was taken afresh (no send of the id
	// was known): the event is certainly not being charged to anyone
	// else. False with Other false: this customer held it already.
	Fresh bool
	// Seen is true, when no claim held the id, unless the tenant's usage
	// filter certainly never saw it committed (within
	// idempotency.SeenHorizon): only then must Postgres be asked.
	Seen bool
}

// AppliedReader finds persisted operations by idempotency key.
type AppliedReader interface {
	// AppliedMutations returns the tenant's persisted Mutations by key.
	AppliedMutations(ctx context.Context, tenant uuid.UUID, keys []string) (map[string]Mutation, error)
}

// EventLog reads a tenant's events in sequence order (Postgres).
type EventLog interface {
	// EventsAfter lists up to limit of the tenant's events with a sequence
	// above after, in sequence order; customer, when set, keeps that
	// customer's only.
	EventsAfter(ctx context.Context, tenant uuid.UUID, customer *uuid.UUID, after int64, limit int) ([]Event, error)
	// LastSequence is the tenant's highest sequence handed out (0 for none).
	LastSequence(ctx context.Context, tenant uuid.UUID) (int64, error)
}

// MeteringStore is the Redis side of pricing, entitlements and reservations (the
// metering of a use, not the usage its events report); every
// method is one atomic script on one customer and returns ErrStateMissing
// when the customer must be loaded first.
type MeteringStore interface {
	// Consume errors: ErrInsufficientCredits (block), ErrOverflow,
	// ErrIdempotencyMismatch, ErrStateMissing.
	Consume(ctx context.Context, cmd ConsumeCommand) (MutationResult, error)
	// ConsumeDry answers the Mutation Consume of cmd (no idempotency key)
	// would write, changing nothing; a refusal comes with the refusal
	// record. Errors as Consume's.
	ConsumeDry(ctx context.Context, cmd ConsumeCommand) (MutationResult, error)
	// ConsumeBatch runs cmds as Consume would, in one round trip, in their
	// order for each customer; results and errors are per command.
	ConsumeBatch(ctx context.Context, cmds []ConsumeCommand) ([]MutationResult, []error)
	// Reserve errors: ErrInsufficientCredits, ErrOverflow, ErrIdempotencyMismatch, ErrStateMissing.
	Reserve(ctx context.Context, cmd ReserveCommand) (MutationResult, error)
	// ReserveDry answers the Mutation Reserve of cmd (no idempotency key)
	// would write, changing nothing. Errors as Reserve's.
	ReserveDry(ctx context.Context, cmd ReserveCommand) (MutationResult, error)
	// Commit errors: ErrReservationNotFound, ErrReservationNotActive,
	// ErrReservationExpired, ErrInsufficientCredits, ErrIdempotencyMismatch, ErrStateMissing.
	Commit(ctx context.Context, cmd CommitCommand) (MutationResult, error)
	// Release errors: ErrReservationNotFound, ErrReservationNotActive, ErrStateMissing.
	Release(ctx context.Context, cmd ReleaseCommand) (MutationResult, error)
	// Extend errors: those of Commit, ErrReservationShorter, ErrOverflow.
	Extend(ctx context.Context, cmd ExtendCommand) (MutationResult, error)
	// Gauge errors: GaugeCapError, ErrGaugeBelowZero, ErrStateMissing.
	Gauge(ctx context.Context, cmd GaugeCommand) (MutationResult, error)
	// GaugeValue reads a counter (0 when never used). Errors: ErrStateMissing.
	GaugeValue(ctx context.Context, c CustomerKey, metric string) (int64, error)
	// DueReservations lists up to limit active reservations of partition p whose
	// expires_at is at or before now.
	DueReservations(ctx context.Context, p int, now time.Time, limit int) ([]DueReservation, error)
	// ReservationRef finds what the store's reservation index records of
	// a reservation (any tenant): its customer and, when recorded, its metric or
	// items; ok is false when the store does not know it.
	ReservationRef(ctx context.Context, id uuid.UUID) (ref ReservationRef, ok bool, err error)
	// ReservationMetadata reads the stored metadata of reservation id of customer c (nil
	// when none); found is false when the store does not hold the reservation.
	ReservationMetadata(ctx context.Context, c CustomerKey, id uuid.UUID) (meta Metadata, found bool, err error)
}

// BatchGranter is a BlockStore that runs many grants in one round trip,
// each its own script call; Import uses it when the store has it.
type BatchGranter interface {
	// GrantBatch applies cmds and returns each one's error, as Grant would.
	GrantBatch(ctx context.Context, cmds []GrantCommand) []error
}

// LeaseStore runs the lease script on one customer (Redis). Errors:
// ErrLeaseNotFound, ErrLeaseEnded, ErrLeaseNotDue, ErrIdempotencyMismatch,
// ErrStateMissing.
type LeaseStore interface {
	Lease(ctx context.Context, cmd LeaseCommand) (MutationResult, error)
}

// LeaseIndex is Postgres' side of leases.
type LeaseIndex interface {
	// DueLeases lists up to limit leases Postgres holds active whose
	// expires_at is at or before now, soonest first.
	DueLeases(ctx context.Context, now time.Time, limit int) ([]DueLease, error)
	// LeaseOf finds lease id of customer c; ok is false when Postgres does
	// not know it.
	LeaseOf(ctx context.Context, c CustomerKey, id uuid.UUID) (StoredLease, bool, error)
}

// OverrideStore keeps overrides (Postgres). Rows are never removed: a
// deleted or replaced override keeps its row with deleted_at set.
type OverrideStore interface {
	OverrideReader
	// CreateOverride inserts o for a subscription of env. When an undeleted
	// override of that metric exists it is ErrOverrideExists if still live
	// at now, else it is marked deleted in the same transaction.
	CreateOverride(ctx context.Context, env Environment, o Override, now time.Time) error
	// UpdateOverride locks the override of key that is live at now on the
	// subscription, lets change edit it (an error from change aborts and is
	// returned as is) and writes it (ErrNotFound when none is live).
	UpdateOverride(ctx context.Context, s Scope, subscription uuid.UUID, key string, now time.Time, change func(*Override) error) (Override, error)
	// DeleteOverride marks the override of key live at now deleted
	// (ErrNotFound when none is live).
	DeleteOverride(ctx context.Context, s Scope, subscription uuid.UUID, key string, now time.Time) error
}

// PlanStore keeps the catalogue (Postgres). Every read and write is scoped
// to one tenant and environment; a row of another scope is ErrNotFound.
type PlanStore interface {
	// CreatePlan inserts p; when p.IsDefault it clears the scope's previous
	// default in the same transaction.
	CreatePlan(ctx context.Context, p Plan) error
	// GetPlan reads one plan (ErrNotFound); Variants is nil.
	GetPlan(ctx context.Context, s Scope, id uuid.UUID) (Plan, error)
	// UpdatePlan locks the plan, lets change edit it (an error from change
	// aborts and is returned as is), writes it and, when it ends up the
	// default, clears the previous default, all in one transaction.
	UpdatePlan(ctx context.Context, s Scope, id uuid.UUID, change func(*Plan) error) (Plan, error)
	// ListPlans pages plans newest first, retired ones too when withRetired.
	ListPlans(ctx context.Context, s Scope, withRetired bool, cursor string, limit int) (Page[Plan], error)

	// CreateVariant inserts v under its plan (ErrNotFound when the plan is
	// not in v's scope).
	CreateVariant(ctx context.Context, v PlanVariant) error
	// GetVariant reads one variant by id alone (ErrNotFound).
	GetVariant(ctx context.Context, s Scope, id uuid.UUID) (PlanVariant, error)
	// UpdateVariant locks the variant of plan planID, lets change edit it and
	// writes it, in one transaction (ErrNotFound).
	UpdateVariant(ctx context.Context, s Scope, planID, id uuid.UUID, change func(*PlanVariant) error) (PlanVariant, error)
	// ListVariants lists the variants of the given plans, oldest first.
	ListVariants(ctx context.Context, s Scope, planIDs []uuid.UUID) ([]PlanVariant, error)

	// CreateGrant inserts g under variant g.PlanVariantID of plan planID
	// (ErrNotFound when that variant is not under that plan in g's scope).
	CreateGrant(ctx context.Context, planID uuid.UUID, g PlanGrant) error
	// ListGrants lists the grants of the given variants, oldest first.
	ListGrants(ctx context.Context, s Scope, variantIDs []uuid.UUID) ([]PlanGrant, error)

	// PutEntitlement replaces the entitlement of e's metric on variant
	// e.PlanVariantID of plan planID with e, in one transaction (ErrNotFound
	// when that variant is not under that plan in e's scope).
	PutEntitlement(ctx context.Context, planID uuid.UUID, e VariantEntitlement) error
	// ListEntitlements lists the entitlements of the given variants, oldest first.
	ListEntitlements(ctx context.Context, s Scope, variantIDs []uuid.UUID) ([]VariantEntitlement, error)
}

// PlanLookup is the hot path's read of the catalogue (PlanFacts, the
// scheduler); CachedPlanStore caches it, NewPlanLookup reads a PlanStore.
type PlanLookup interface {
	// VariantDetail reads a variant with its grants and entitlements
	// (ErrNotFound).
	VariantDetail(ctx context.Context, s Scope, id uuid.UUID) (VariantDetail, error)
	// PlanName reads the name of a plan (ErrNotFound).
	PlanName(ctx context.Context, s Scope, id uuid.UUID) (string, error)
}

// MetricLookup finds a billable metric by key; *Metering is one.
type MetricLookup interface {
	// Metric reports the metric of key in scope; ok is false when none exists.
	Metric(ctx context.Context, scope Scope, key string) (BillableMetric, bool, error)
}

// ReconcileStore is the hot store's side of a reconcile pass.
type ReconcileStore interface {
	// StoredAccounts reads the customers' state, one per customer in order.
	StoredAccounts(ctx context.Context, customers []uuid.UUID) ([]StoredAccount, error)
	// Reload replaces the customer's state with s only while the store
	// still holds version expect (-1: no state), whatever the versions;
	// it reports whether it wrote.
	Reload(ctx context.Context, s AccountState, expect int64) (bool, error)
}

// ReconcileSource is the system of record's side of a reconcile pass.
type ReconcileSource interface {
	AccountPages
	// AccountReader reads one account again, for the reload.
	AccountReader
	// LedgerSums is the sum of the ledger deltas of each customer (absent:
	// no entries).
	LedgerSums(ctx context.Context, customers []uuid.UUID) (map[uuid.UUID]int64, error)
}

// ReconcileFencer is a ReconcileSource that can fence a store's diverged
// history before a reload: versions up to past storeVersion are refused to
// the persister from then on, and the account's version moves above them
// (persist.Store.FenceFork). It returns the fence; ok is false when
// Postgres holds no account.
type ReconcileFencer interface {
	FenceFork(ctx context.Context, c CustomerKey, storeVersion int64) (fenced int64, ok bool, err error)
}

// ScopedReconcileSource pages the accounts of a scope with what a
// comparison needs (account row and live blocks; the reload reads the
// whole state again with AccountState).
type ScopedReconcileSource interface {
	ReconcileStates(ctx context.Context, scope ReconcileScope, after uuid.UUID, limit int) ([]AccountState, error)
}

// ReconcileSampleSource is Postgres' side of the sampler.
type ReconcileSampleSource interface {
	// SampleStates reads up to n accounts picked at random (account row
	// and live blocks), in no particular order.
	SampleStates(ctx context.Context, n int) ([]AccountState, error)
	// ReconcileStates pages the accounts of a scope (ScopedReconcileSource);
	// the sampler reads one customer again with it.
	ScopedReconcileSource
}

// ReservationReader reads reservations from the system of record.
type ReservationReader interface {
	// GetReservation finds a reservation of tenant by id (ErrNotFound).
	GetReservation(ctx context.Context, tenant, id uuid.UUID) (Reservation, error)
	// ListReservations pages a customer's reservations newest first; status "" is all.
	ListReservations(ctx context.Context, c CustomerKey, status string, cursor string, limit int) (Page[Reservation], error)
	// ReservationCustomer finds the customer of a reservation of tenant
	// (ErrNotFound, for another tenant's reservation too).
	ReservationCustomer(ctx context.Context, tenant, id uuid.UUID) (CustomerKey, error)
}

// SubscriptionStore keeps subscriptions and their scheduler state (Postgres).
type SubscriptionStore interface {
	SubscriptionReader
	// CreateSubscription inserts r and r.Events in one transaction;
	// ErrLiveSubscription when the customer already has a live subscription.
	CreateSubscription(ctx context.Context, r SubscriptionRecord) error
	// GetRecord reads a subscription with its bookkeeping (ErrNotFound).
	GetRecord(ctx context.Context, s Scope, id uuid.UUID) (SubscriptionRecord, error)
	// ListSubscriptions pages a customer's subscriptions newest first.
	ListSubscriptions(ctx context.Context, s Scope, customer uuid.UUID, cursor string, limit int) (Page[Subscription], error)
	// UpdateSubscription locks subscription id of scope s, lets change edit
	// the record (an error aborts and is returned as is) and writes it and
	// the events change added to its Events, in one transaction
	// (ErrNotFound).
	UpdateSubscription(ctx context.Context, s Scope, id uuid.UUID, change func(*SubscriptionRecord) error) (SubscriptionRecord, error)
	// RunDue runs change on up to limit subscriptions whose NextActionAt is
	// at or before now, each locked (FOR UPDATE SKIP LOCKED, so processes
	// share the work) and written in its own transaction. A change error
	// rolls that one back and skips it until the next call. The record and
	// the events change added to its Events are written together. It
	// returns how many it ran.
	RunDue(ctx context.Context, now time.Time, limit int, change func(ctx context.Context, r *SubscriptionRecord) error) (int, error)
	// PeriodUsage sums the customer's consumption per metric in [from, to).
	PeriodUsage(ctx context.Context, c CustomerKey, from, to time.Time) ([]MetricUsage, error)
}

// RolloverStore runs rollovers on the hot credit state (Redis).
type RolloverStore interface {
	// Rollover returns a zero Mutation when no listed block has credit left
	// (and none was due). Errors: ErrStateMissing, ErrIdempotencyMismatch.
	Rollover(ctx context.Context, cmd RolloverCommand) (MutationResult, error)
}

// SubscriptionReader finds subscriptions (Postgres).
type SubscriptionReader interface {
	// GetSubscription finds a subscription by id in scope (ErrNotFound).
	GetSubscription(ctx context.Context, s Scope, id uuid.UUID) (Subscription, error)
	// LiveSubscription is the customer's non-terminal subscription
	// (ErrNotFound when none).
	LiveSubscription(ctx context.Context, c CustomerKey) (Subscription, error)
}

// OverrideReader reads a subscription's live overrides (Postgres).
type OverrideReader interface {
	// LiveOverrides are the overrides of the subscription (of tenant) that
	// are neither deleted nor expired at now.
	LiveOverrides(ctx context.Context, tenant, subscription uuid.UUID, now time.Time) ([]Override, error)
}

// BatchLoader loads many states in one round trip, each fenced like Load.
type BatchLoader interface {
	LoadBatch(ctx context.Context, states []AccountState) ([]bool, error)
}

// TopupReader lists a customer's topups from the ledger (Postgres).
type TopupReader interface {
	// Topups pages the customer's topup entries newest first (a bad cursor
	// is a 400).
	Topups(ctx context.Context, c CustomerKey, cursor string, limit int) (Page[Topup], error)
}

// EventStore is the durable event record (Postgres).
type EventStore interface {
	// InsertEvent writes a pending event unless one with its id and
	// instant exists: its id is fresh (test.ping), so only a retry of the
	// same event can meet a stored one.
	InsertEvent(ctx context.Context, e Event) error
	// ClaimDue leases up to limit events due at now (pending or failed,
	// next_retry_at <= now, no live lease) until now+lease, at most perTenant
	// of any one tenant and none of the tenants in skip. Each claimed event
	// carries its lease token in the returned Claim; safe across processes.
	ClaimDue(ctx context.Context, now time.Time, lease time.Duration, limit, perTenant int, skip []uuid.UUID) ([]Claim, error)
	// RecordAttempt stores one attempt and the event's new state, provided
	// the claim's lease is still the event's; ok is false when it was not
	// (the attempt is dropped: another worker owns the event now). c is
	// as ClaimDue returned it: persist finds the event by its id, tenant
	// and created_at (its month partition, migration 035).
	RecordAttempt(ctx context.Context, c Claim, a Attempt) (ok bool, err error)
	// ListEvents pages a tenant's events (both environments) newest first.
	ListEvents(ctx context.Context, tenant uuid.UUID, q EventQuery) (Page[Event], error)
	// Redeliver moves a dead letter back to pending with attempts 0, due at
	// now. Errors: ErrNotFound (unknown or another tenant's), ErrNotDeadLetter.
	Redeliver(ctx context.Context, tenant, id uuid.UUID, now time.Time) (Event, error)
}

// TenantReader reads a tenant afresh (the webhook URL and current secret).
type TenantReader interface {
	GetTenant(ctx context.Context, id uuid.UUID) (Tenant, error)
}

// Sender posts one signed body (internal/sender on net/http).
type Sender interface {
	Send(ctx context.Context, url string, headers map[string]string, body []byte) SendResult
}

// FeedWakes carries wakes of the tenants' change feeds between the
// processes of a fleet (lua.Store: Redis pub/sub), so a feed reads when
// something is new instead of at its next poll. A wake is a hint: one
// lost (Redis down, a node reconnecting) costs a poll's latency, never a
// change, since the poll still runs.
type FeedWakes interface {
	// PublishWakes tells every node that what is new for tenants.
	PublishWakes(ctx context.Context, what FeedWake, tenants []uuid.UUID) error
	// FollowWakes calls wake for every wake published until ctx ends or
	// the subscription fails, and resumed each time it is (again)
	// subscribed: the wakes published before it may be lost.
	FollowWakes(ctx context.Context, wake func(FeedWake, uuid.UUID), resumed func()) error
}
