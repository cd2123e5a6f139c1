package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/creditd/creditd/engine"
)

// Store is the Postgres implementation of the engine's Directory,
// LedgerReader, LedgerWriter and RebuildSource. It is safe for concurrent
// use; every method is bounded by the pool's statement timeout.
type Store struct {
	pool *pgxpool.Pool
	// replays counts Applies whose lean write met a stored row and were
	// written again with ON CONFLICT (ledger.go).
	replays atomic.Int64
	// copyMin is the smallest batch the lean write copies in (copy.go).
	copyMin int
	// alerts caches the scopes that have alert settings (alerts.go).
	alerts alertScopes
	// fullRecords writes what the release before migration 023 wrote
	// (WithFullRecords).
	fullRecords bool
	// monthGuesses keeps each tenant's spans of event sequences as its
	// last events page read them (eventmonths.go).
	monthGuesses monthGuesses
}

// recordShape is how Apply records a batch (ophead.go, eventbody.go).
type recordShape bool

// Record shapes.
const (
	// shapeLean records a consume and a reservation's reserve, commit and
	// release on their ledger entry (op_head, ophead.go and
	// ophead_reservation.go), any other keyed operation as an operations row, and events without the body
	// members their columns hold.
	shapeLean recordShape = false
	// shapeFull records every keyed operation as an operations row and
	// every event's whole body.
	shapeFull recordShape = true
)

// WithFullRecords makes Apply write what the release before migration 023
// wrote: every keyed operation's whole Mutation in operations, a consume's
// included, and every event's whole body. It is for the length of a
// rolling upgrade from that release, whose nodes look keys up in
// operations only and deliver stored bodies as they are
// (docs/operations.md). It is not safe to call once the Store is in use.
func (s *Store) WithFullRecords(on bool) *Store {
	s.fullRecords = on
	return s
}

// shape is the record shape Apply writes.
func (s *Store) shape() recordShape { return recordShape(s.fullRecords) }

var (
	_ engine.Directory     = (*Store)(nil)
	_ engine.LedgerReader  = (*Store)(nil)
	_ engine.LedgerWriter  = (*Store)(nil)
	_ engine.RebuildSource = (*Store)(nil)
)

// NewStore returns a Store on pool (see Open); the caller keeps ownership
// of the pool and closes it.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool, copyMin: copyMinMutations} }

// uniqueViolation is SQLSTATE 23505.
const uniqueViolation = "23505"

// isUniqueViolation reports whether err is a unique violation of
// constraint ("": any). Between migration 031's expand and contract steps a
// unique key exists twice, the old one and its twin with tenant_id (named
// with the suffix _t), and either may be the one Postgres reports.
func isUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == uniqueViolation &&
		(constraint == "" || pgErr.ConstraintName == constraint || pgErr.ConstraintName == constraint+"_t")
}

// notFound wraps engine.ErrNotFound with what was missing, for logs.
func notFound(what string) error { return fmt.Errorf("%s: %w", what, engine.ErrNotFound) }

// metadataJSON renders m as a JSON object; nil becomes {} so the column
// never holds a JSON null.
func metadataJSON(m engine.Metadata) ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	return json.Marshal(m)
}

// rawObject keeps raw JSON as is, turning empty or null into {}.
func rawObject(raw json.RawMessage) []byte {
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}")
	}
	return raw
}

// parseMetadata decodes a JSONB object column.
func parseMetadata(b []byte) (engine.Metadata, error) {
	m := engine.Metadata{}
	if len(b) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("persist: bad metadata: %w", err)
	}
	if m == nil {
		m = engine.Metadata{}
	}
	return m, nil
}

// ---- tenants ----

const tenantColumns = `id, name, default_overage_policy, default_low_balance_threshold_mc,
	webhook_url, webhook_secret, rate_limit_per_second, rate_limit_burst, created_at, updated_at`

// CreateTenant inserts t as given (the caller fills defaults and times).
func (s *Store) CreateTenant(ctx context.Context, t engine.Tenant) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO tenants (`+tenantColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		t.ID, t.Name, string(t.DefaultOveragePolicy), t.DefaultLowBalanceThresholdMC,
		t.WebhookURL, t.WebhookSecret, t.RateLimitPerSecond, t.RateLimitBurst, t.CreatedAt, t.UpdatedAt)
	if err != nil {
		return fmt.Errorf("persist: create tenant: %w", err)
	}
	return nil
}

// GetTenant reads one tenant; engine.ErrNotFound when unknown.
func (s *Store) GetTenant(ctx context.Context, id uuid.UUID) (engine.Tenant, error) {
	var t engine.Tenant
	var policy string
	err := s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id).Scan(
		&t.ID, &t.Name, &policy, &t.DefaultLowBalanceThresholdMC, &t.WebhookURL, &t.WebhookSecret,
		&t.RateLimitPerSecond, &t.RateLimitBurst, &t.CreatedAt, &t.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Tenant{}, notFound("tenant")
	}
	if err != nil {
		return engine.Tenant{}, fmt.Errorf("persist: get tenant: %w", err)
	}
	t.DefaultOveragePolicy = engine.OveragePolicy(policy)
	return t, nil
}

// UpdateTenant writes every mutable field of t (all but id and created_at);
// engine.ErrNotFound when unknown.
func (s *Store) UpdateTenant(ctx context.Context, t engine.Tenant) error {
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET name = $2, default_overage_policy = $3,
			default_low_balance_threshold_mc = $4, webhook_url = $5, webhook_secret = $6,
			rate_limit_per_second = $7, rate_limit_burst = $8, updated_at = $9
		WHERE id = $1`,
		t.ID, t.Name, string(t.DefaultOveragePolicy), t.DefaultLowBalanceThresholdMC,
		t.WebhookURL, t.WebhookSecret, t.RateLimitPerSecond, t.RateLimitBurst, t.UpdatedAt)
	if err != nil {
		return fmt.Errorf("persist: update tenant: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("tenant")
	}
	return nil
}

// ---- API keys ----

// CreateAPIKey stores k under hash, the SHA-256 of its plain text; the
// plain text (k.Key) is never stored.
func (s *Store) CreateAPIKey(ctx context.Context, k engine.APIKey, hash []byte) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys (id, tenant_id, environment, key_hash, created_at, revoked_at)
		VALUES ($1, $2, $3, $4, $5, $6)`,
		k.ID, k.TenantID, string(k.Environment), hash, k.CreatedAt, k.RevokedAt)
	if err != nil {
		return fmt.Errorf("persist: create api key: %w", err)
	}
	return nil
}

// APIKeyByHash finds an unrevoked key by the SHA-256 of its text;
// engine.ErrNotFound when unknown or revoked.
func (s *Store) APIKeyByHash(ctx context.Context, hash []byte) (engine.APIKey, error) {
	var k engine.APIKey
	var env string
	err := s.pool.QueryRow(ctx, `SELECT id, tenant_id, environment, created_at, revoked_at
		FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL`, hash).Scan(
		&k.ID, &k.TenantID, &env, &k.CreatedAt, &k.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.APIKey{}, notFound("api key")
	}
	if err != nil {
		return engine.APIKey{}, fmt.Errorf("persist: api key by hash: %w", err)
	}
	k.Environment = engine.Environment(env)
	return k, nil
}

// RevokeAPIKey marks key of tenant revoked at at; engine.ErrNotFound when
// the tenant has no such key or it is already revoked.
func (s *Store) RevokeAPIKey(ctx context.Context, tenant, key uuid.UUID, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = $3
		WHERE id = $2 AND tenant_id = $1 AND revoked_at IS NULL`, tenant, key, at)
	if err != nil {
		return fmt.Errorf("persist: revoke api key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("api key")
	}
	return nil
}

// ---- customers ----

const customerColumns = `id, tenant_id, environment, external_id, display_name, overage_policy,
	low_balance_threshold_mc, metadata, created_at, updated_at, deleted_at, credit_limit_mc, budgets,
	parent_id, parent_draw_limit`

// customerExternalIDKey is the partial unique index of live external ids.
const customerExternalIDKey = "customers_external_id_key"

func scanCustomer(row pgx.Row) (engine.Customer, error) {
	var c engine.Customer
	var env string
	var policy *string
	var meta, budgets, drawLimit []byte
	if err := row.Scan(&c.ID, &c.TenantID, &env, &c.ExternalID, &c.DisplayName, &policy,
		&c.LowBalanceThresholdMC, &meta, &c.CreatedAt, &c.UpdatedAt, &c.DeletedAt, &c.CreditLimitMC, &budgets,
		&c.ParentID, &drawLimit); err != nil {
		return engine.Customer{}, err
	}
	if drawLimit != nil {
		c.ParentDrawLimit = &engine.DrawLimit{}
		if err := json.Unmarshal(drawLimit, c.ParentDrawLimit); err != nil {
			return engine.Customer{}, fmt.Errorf("persist: customer %s parent_draw_limit: %w", c.ID, err)
		}
	}
	c.Budgets = []engine.Budget{}
	if err := json.Unmarshal(budgets, &c.Budgets); err != nil {
		return engine.Customer{}, fmt.Errorf("persist: customer %s budgets: %w", c.ID, err)
	}
	c.Environment = engine.Environment(env)
	if policy != nil {
		p := engine.OveragePolicy(*policy)
		c.OveragePolicy = &p
	}
	m, err := parseMetadata(meta)
	if err != nil {
		return engine.Customer{}, err
	}
	c.Metadata = m
	return c, nil
}

// budgetsJSON is column budgets of bs (migration 029): "[]" for none.
func budgetsJSON(bs []engine.Budget) string {
	if len(bs) == 0 {
		return "[]"
	}
	b, err := json.Marshal(bs)
	if err != nil {
		// Budget holds strings, numbers and a time: Marshal cannot fail.
		panic(err)
	}
	return string(b)
}

// drawLimitJSON is column parent_draw_limit of d (migration 032): NULL
// for none.
func drawLimitJSON(d *engine.DrawLimit) *string {
	if d == nil {
		return nil
	}
	b, err := json.Marshal(d)
	if err != nil {
		// DrawLimit holds strings, a number and a time: Marshal cannot fail.
		panic(err)
	}
	s := string(b)
	return &s
}

// HasChildren reports whether a live customer of scope sc names id as its
// parent (customers_parent_idx).
func (s *Store) HasChildren(ctx context.Context, sc engine.Scope, id uuid.UUID) (bool, error) {
	var any bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM customers
		WHERE tenant_id = $1 AND parent_id = $2 AND environment = $3 AND deleted_at IS NULL)`,
		sc.TenantID, id, string(sc.Environment)).Scan(&any)
	if err != nil {
		return false, fmt.Errorf("persist: customer children: %w", err)
	}
	return any, nil
}

func policyParam(p *engine.OveragePolicy) *string {
	if p == nil {
		return nil
	}
	s := string(*p)
	return &s
}

// CreateCustomer inserts c; engine.ErrExternalIDTaken when a live customer
// of the same tenant and environment already has its external id, and
// engine.ErrPoolTooDeep when c's parent got a parent meanwhile (poolLock).
func (s *Store) CreateCustomer(ctx context.Context, c engine.Customer) error {
	meta, err := metadataJSON(c.Metadata)
	if err != nil {
		return fmt.Errorf("persist: create customer: %w", err)
	}
	err = s.withPoolLock(ctx, c, func(db execer) error {
		_, err := db.Exec(ctx, `INSERT INTO customers (`+customerColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
			c.ID, c.TenantID, string(c.Environment), c.ExternalID, c.DisplayName, policyParam(c.OveragePolicy),
			c.LowBalanceThresholdMC, meta, c.CreatedAt, c.UpdatedAt, c.DeletedAt, c.CreditLimitMC, budgetsJSON(c.Budgets),
			c.ParentID, drawLimitJSON(c.ParentDrawLimit))
		return err
	})
	if errors.Is(err, engine.ErrPoolTooDeep) {
		return err
	}
	if isUniqueViolation(err, customerExternalIDKey) {
		return engine.ErrExternalIDTaken
	}
	if err != nil {
		return fmt.Errorf("persist: create customer: %w", err)
	}
	return nil
}

// UpdateCustomer writes display_name, overage_policy,
// low_balance_threshold_mc, credit_limit_mc, budgets, parent_id,
// parent_draw_limit, metadata and updated_at of the live customer
// c.ID in c's tenant and environment; engine.ErrNotFound when there is none,
// engine.ErrPoolTooDeep when, with a parent, the parent got a parent or c
// got a child meanwhile (poolLock). The external id never changes.
func (s *Store) UpdateCustomer(ctx context.Context, c engine.Customer) error {
	meta, err := metadataJSON(c.Metadata)
	if err != nil {
		return fmt.Errorf("persist: update customer: %w", err)
	}
	var rows int64
	err = s.withPoolLock(ctx, c, func(db execer) error {
		tag, err := db.Exec(ctx, `UPDATE customers SET display_name = $4, overage_policy = $5,
			low_balance_threshold_mc = $6, metadata = $7, updated_at = $8, credit_limit_mc = $9,
			budgets = $10, parent_id = $11, parent_draw_limit = $12
		WHERE id = $1 AND tenant_id = $2 AND environment = $3 AND deleted_at IS NULL`,
			c.ID, c.TenantID, string(c.Environment), c.DisplayName, policyParam(c.OveragePolicy),
			c.LowBalanceThresholdMC, meta, c.UpdatedAt, c.CreditLimitMC, budgetsJSON(c.Budgets),
			c.ParentID, drawLimitJSON(c.ParentDrawLimit))
		rows = tag.RowsAffected()
		return err
	})
	if errors.Is(err, engine.ErrPoolTooDeep) {
		return err
	}
	if err != nil {
		return fmt.Errorf("persist: update customer: %w", err)
	}
	if rows == 0 {
		return notFound("customer")
	}
	return nil
}

// execer is what a customer write needs of a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// withPoolLock runs write (c's insert or update): as one statement when c
// has no parent, else in a transaction that first locks the parent's row and c's (in id order,
// so two writers never wait on each other in a cycle) and then checks what
// the engine checked before it: the parent has no parent and c no child.
// Two requests each joining one level (A under B, B under C) both pass the
// engine's checks, which read before either writes; under the locks the
// second sees the first's committed row and is refused, so no pool is ever
// two levels deep (TestPoolChainRace).
func (s *Store) withPoolLock(ctx context.Context, c engine.Customer, write func(execer) error) error {
	if c.ParentID == nil {
		return write(s.pool)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM customers WHERE tenant_id = $1 AND id = ANY($2)
			ORDER BY id FOR UPDATE`, c.TenantID, []uuid.UUID{c.ID, *c.ParentID}); err != nil {
			return err
		}
		var deep bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM customers
				WHERE tenant_id = $1 AND id = $2 AND parent_id IS NOT NULL)
			OR EXISTS (SELECT 1 FROM customers
				WHERE tenant_id = $1 AND parent_id = $3 AND environment = $4 AND deleted_at IS NULL)`,
			c.TenantID, *c.ParentID, c.ID, string(c.Environment)).Scan(&deep); err != nil {
			return err
		}
		if deep {
			return engine.ErrPoolTooDeep
		}
		return write(tx)
	})
}

// DeleteCustomer soft-deletes customer id of scope s (sets deleted_at
// only, docs/spec/interface.md Customers); engine.ErrNotFound when it is missing or
// already deleted.
func (s *Store) DeleteCustomer(ctx context.Context, sc engine.Scope, id uuid.UUID, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE customers SET deleted_at = $4
		WHERE id = $1 AND tenant_id = $2 AND environment = $3 AND deleted_at IS NULL`,
		id, sc.TenantID, string(sc.Environment), at)
	if err != nil {
		return fmt.Errorf("persist: delete customer: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("customer")
	}
	return nil
}

// CustomerByExternalID finds the live customer with externalID in scope
// s; engine.ErrNotFound when there is none.
func (s *Store) CustomerByExternalID(ctx context.Context, sc engine.Scope, externalID string) (engine.Customer, error) {
	c, err := scanCustomer(s.pool.QueryRow(ctx, `SELECT `+customerColumns+` FROM customers
		WHERE tenant_id = $1 AND environment = $2 AND external_id = $3 AND deleted_at IS NULL`,
		sc.TenantID, string(sc.Environment), externalID))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Customer{}, notFound("customer")
	}
	if err != nil {
		return engine.Customer{}, fmt.Errorf("persist: customer by external id: %w", err)
	}
	return c, nil
}

// CustomerByID finds a live customer by id in any tenant and environment,
// so the caller can tell "other tenant" from "unknown"; engine.ErrNotFound
// when unknown or deleted.
func (s *Store) CustomerByID(ctx context.Context, id uuid.UUID) (engine.Customer, error) {
	c, err := scanCustomer(s.pool.QueryRow(ctx, `SELECT `+customerColumns+` FROM customers
		WHERE id = $1 AND deleted_at IS NULL`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Customer{}, notFound("customer")
	}
	if err != nil {
		return engine.Customer{}, fmt.Errorf("persist: customer by id: %w", err)
	}
	return c, nil
}

// likeEscaper makes user text match literally inside a LIKE pattern
// (backslash is LIKE's default escape character).
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// ListCustomers pages the live customers of scope s newest first
// (created_at DESC, id DESC). A non-empty search keeps those whose
// external_id or display_name contains it, ignoring case. limit is 1..100
// (validated by the caller); a bad cursor is engine.BadRequest("cursor").
func (s *Store) ListCustomers(ctx context.Context, sc engine.Scope, search, cursor string, limit int) (engine.Page[engine.Customer], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.Customer]{}, err
	}
	var q strings.Builder
	q.WriteString(`SELECT ` + customerColumns + ` FROM customers
		WHERE tenant_id = $1 AND environment = $2 AND deleted_at IS NULL`)
	args := []any{sc.TenantID, string(sc.Environment)}
	if search != "" {
		args = append(args, "%"+likeEscaper.Replace(search)+"%")
		fmt.Fprintf(&q, ` AND (external_id ILIKE $%d OR display_name ILIKE $%[1]d)`, len(args))
	}
	if hasAfter {
		args = append(args, after.at, after.id)
		fmt.Fprintf(&q, ` AND (created_at, id) < ($%d, $%d)`, len(args)-1, len(args))
	}
	args = append(args, limit+1)
	fmt.Fprintf(&q, ` ORDER BY created_at DESC, id DESC LIMIT $%d`, len(args))

	rows, err := s.pool.Query(ctx, q.String(), args...)
	if err != nil {
		return engine.Page[engine.Customer]{}, fmt.Errorf("persist: list customers: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Customer, error) { return scanCustomer(r) })
	if err != nil {
		return engine.Page[engine.Customer]{}, fmt.Errorf("persist: list customers: %w", err)
	}
	return pageOf(list, limit, func(c engine.Customer) pageKey { return pageKey{at: c.CreatedAt, id: c.ID} }), nil
}
