package persist

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.up.sql migrations/*.contract.sql
var migrationFiles embed.FS

// migrationLockKey is the pg_advisory_lock key that serializes Migrate
// across creditd processes starting at once ("creditd" in ASCII).
const migrationLockKey int64 = 0x63726564697464

// migration is one numbered schema step.
type migration struct {
	version int
	name    string
	sql     string
}

// Suffixes of the two kinds of migration file. An expand step
// (NNN_slug.up.sql) keeps what the previous release's statements need and
// is applied at every start; a contract step (NNN_slug.contract.sql, same
// number as its expand) removes what only that release needed, and is
// applied by MigrateContract once no node of it runs, or at once on a
// fresh database (docs/decisions.md "Tenant keys: expand now, contract
// later").
const (
	expandSuffix   = ".up.sql"
	contractSuffix = ".contract.sql"
)

// migrations reads the embedded NNN_slug.up.sql files in version order.
func migrations() ([]migration, error) { return migrationsOf(expandSuffix) }

// contractions reads the embedded NNN_slug.contract.sql files in version
// order; each names the expand migration of its number.
func contractions() ([]migration, error) { return migrationsOf(contractSuffix) }

func migrationsOf(suffix string) ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, suffix) {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("persist: migration %q is not named NNN_slug%s", name, suffix)
		}
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("persist: migration %q has no positive number", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("persist: migrations %q and %q share number %d", prev, name, v)
		}
		seen[v] = name
		body, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: strings.TrimSuffix(name, suffix), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate applies the embedded expand migrations not yet recorded in
// schema_migrations, in order, each in its own transaction. A session
// advisory lock makes concurrent callers (several creditd processes starting
// at once) run one after another; the later ones find nothing left to do.
//
// On a fresh database (schema_migrations empty: no node of any release can
// be running on it) the contract migrations follow at once, so a new
// database starts on the final schema. On an existing one they wait for
// MigrateContract: a node of the previous release may still be running.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, migratePlan{upTo: 0, contract: contractIfFresh})
}

// MigrateContract applies the expand migrations still pending, then every
// contract migration not yet recorded in schema_contracts. Run it (creditd
// migrate contract) once no node of a release older than this binary runs:
// a contract step drops what those nodes' statements need.
func MigrateContract(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, migratePlan{upTo: 0, contract: contractAlways})
}

// contractWhen says when migrate applies the contract steps.
type contractWhen int

const (
	contractNever contractWhen = iota
	contractIfFresh
	contractAlways
)

// migratePlan bounds a migrate run: upTo > 0 stops the expand steps after
// that version (tests build an older schema with it).
type migratePlan struct {
	upTo     int
	contract contractWhen
}

func migrate(ctx context.Context, pool *pgxpool.Pool, plan migratePlan) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	cs, err := contractions()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("persist: migrate: acquire: %w", err)
	}
	// Waiting for the lock and running a migration may take longer than
	// the session's statement_timeout; the caller's ctx bounds them instead.
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		conn.Release()
		return fmt.Errorf("persist: migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockKey); err != nil {
		// The session may hold a half-set state; never hand it back.
		_ = conn.Hijack().Close(context.Background())
		return fmt.Errorf("persist: migrate: advisory lock: %w", err)
	}
	defer func() {
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), ConnectTimeout)
		defer cancel()
		_, uerr := conn.Exec(cleanup, "SELECT pg_advisory_unlock($1)", migrationLockKey)
		_, rerr := conn.Exec(cleanup, "RESET statement_timeout")
		if uerr != nil || rerr != nil {
			// Closing the session is the sure way to drop a session lock.
			_ = conn.Hijack().Close(cleanup)
			return
		}
		conn.Release()
	}()

	for _, ddl := range []string{`CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
	)`, `CREATE TABLE IF NOT EXISTS schema_contracts (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
	)`} {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("persist: migrate: create bookkeeping: %w", err)
		}
	}
	applied, err := recordedVersions(ctx, conn.Conn(), "schema_migrations")
	if err != nil {
		return fmt.Errorf("persist: migrate: %w", err)
	}
	if st := statusOf(ms, applied); len(st.Unknown) > 0 {
		return st.Check()
	}
	fresh := len(applied) == 0
	run := func(m migration, table string) error {
		_, err := applyStep(ctx, conn.Conn(), m, table)
		return err
	}
	for _, m := range ms {
		if applied[m.version] || (plan.upTo > 0 && m.version > plan.upTo) {
			continue
		}
		if err := run(m, "schema_migrations"); err != nil {
			return err
		}
		applied[m.version] = true
	}
	if plan.contract == contractNever || (plan.contract == contractIfFresh && !fresh) {
		return nil
	}
	contracted, err := recordedVersions(ctx, conn.Conn(), "schema_contracts")
	if err != nil {
		return fmt.Errorf("persist: migrate: %w", err)
	}
	// Contract steps run after every expand step this run applied, in
	// version order, so a fresh database and an upgraded one take them in
	// the same order.
	for _, c := range cs {
		if contracted[c.version] || !applied[c.version] {
			continue
		}
		if err := run(c, "schema_contracts"); err != nil {
			return err
		}
	}
	return nil
}

// applyStep runs migration m in one transaction and records it in table
// (schema_migrations or schema_contracts). A step that takes a table lock
// and then a stronger one (024's CREATE INDEX then DROP INDEX, a
// contract's read then ALTER) can deadlock with the persisters of nodes
// still running; Postgres then rolls one transaction back. The step is
// one transaction, so it runs again, up to migrateDeadlockAttempts times;
// attempts says how many it took.
func applyStep(ctx context.Context, conn *pgx.Conn, m migration, table string) (attempts int, err error) {
	for attempts = 1; ; attempts++ {
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if !isDeadlock(err) || attempts == migrateDeadlockAttempts || !sleepCtx(ctx, time.Duration(attempts)*100*time.Millisecond) {
			break
		}
	}
	if err != nil {
		return attempts, fmt.Errorf("persist: migrate: apply %s (%s): %w", m.name, table, err)
	}
	return attempts, nil
}

// migrateDeadlockAttempts bounds how often migrate runs a step that
// Postgres rolled back as a deadlock's victim (make upgrade-test met one
// applying 024 beside the previous release's persisters).
const migrateDeadlockAttempts = 5

// isDeadlock reports whether err is SQLSTATE 40P01.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// sleepCtx waits d, or less when ctx ends first (false then).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// recordedVersions reads the versions a bookkeeping table records.
func recordedVersions(ctx context.Context, conn *pgx.Conn, table string) (map[int]bool, error) {
	rows, err := conn.Query(ctx, "SELECT version FROM "+table)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	out := make(map[int]bool, len(versions))
	for _, v := range versions {
		out[int(v)] = true
	}
	return out, nil
}

// ErrSchemaNewer is returned when the database records a migration this
// binary does not know: a newer creditd migrated it, and this one would
// write rows the newer schema may reject or misread.
var ErrSchemaNewer = errors.New("the database schema is newer than this creditd")

// ErrSchemaBehind is returned by SchemaStatus.Check when migrations are
// pending: only `creditd serve` and `creditd migrate up` apply them.
var ErrSchemaBehind = errors.New("the database schema is older than this creditd")

// SchemaStatus is where a database's schema stands against the migrations
// embedded in this binary.
type SchemaStatus struct {
	// Applied lists the versions recorded in schema_migrations, ascending.
	Applied []int
	// Pending names the embedded migrations not applied yet, in order.
	Pending []string
	// Unknown lists recorded versions this binary does not embed.
	Unknown []int
	// Latest is the newest embedded version.
	Latest int
	// PendingContract names the contract migrations whose expand step is
	// applied but which are not themselves (schema_contracts): the schema
	// still carries what an older release needs. Check does not count them:
	// this binary runs on the expanded schema.
	PendingContract []string
}

// Check returns nil when the schema is exactly this binary's, ErrSchemaNewer
// (wrapped, with the versions) when a newer creditd migrated it, and
// ErrSchemaBehind when migrations are pending.
func (s SchemaStatus) Check() error {
	switch {
	case len(s.Unknown) > 0:
		return fmt.Errorf("%w: it records migration %d, this binary knows up to %d; run the newer creditd", ErrSchemaNewer, s.Unknown[len(s.Unknown)-1], s.Latest)
	case len(s.Pending) > 0:
		return fmt.Errorf("%w: %d migrations pending (first %s); run `creditd migrate up`", ErrSchemaBehind, len(s.Pending), s.Pending[0])
	}
	return nil
}

// Schema reads schema_migrations (absent: nothing applied) and compares it
// with the embedded migrations; it changes nothing.
func Schema(ctx context.Context, pool *pgxpool.Pool) (SchemaStatus, error) {
	ms, err := migrations()
	if err != nil {
		return SchemaStatus{}, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return SchemaStatus{}, fmt.Errorf("persist: schema: %w", err)
	}
	applied := map[int]bool{}
	contracted := map[int]bool{}
	if exists {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return SchemaStatus{}, fmt.Errorf("persist: schema: %w", err)
		}
		defer conn.Release()
		if applied, err = recordedVersions(ctx, conn.Conn(), "schema_migrations"); err != nil {
			return SchemaStatus{}, fmt.Errorf("persist: schema: %w", err)
		}
		var hasContracts bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass('schema_contracts') IS NOT NULL").Scan(&hasContracts); err != nil {
			return SchemaStatus{}, fmt.Errorf("persist: schema: %w", err)
		}
		if hasContracts {
			if contracted, err = recordedVersions(ctx, conn.Conn(), "schema_contracts"); err != nil {
				return SchemaStatus{}, fmt.Errorf("persist: schema: %w", err)
			}
		}
	}
	st := statusOf(ms, applied)
	cs, err := contractions()
	if err != nil {
		return SchemaStatus{}, err
	}
	for _, c := range cs {
		if applied[c.version] && !contracted[c.version] {
			st.PendingContract = append(st.PendingContract, c.name)
		}
	}
	return st, nil
}

// statusOf compares the recorded versions with the embedded migrations ms
// (in version order).
func statusOf(ms []migration, applied map[int]bool) SchemaStatus {
	var st SchemaStatus
	known := map[int]bool{}
	for _, m := range ms {
		known[m.version] = true
		st.Latest = max(st.Latest, m.version)
		if !applied[m.version] {
			st.Pending = append(st.Pending, m.name)
		}
	}
	for v := range applied {
		st.Applied = append(st.Applied, v)
		if !known[v] {
			st.Unknown = append(st.Unknown, v)
		}
	}
	sort.Ints(st.Applied)
	sort.Ints(st.Unknown)
	return st
}
