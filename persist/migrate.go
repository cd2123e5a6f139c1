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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.up.sql
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

// migrations reads the embedded NNN_slug.up.sql files in version order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".up.sql") {
			return nil, fmt.Errorf("persist: migration %q is not named NNN_slug.up.sql", name)
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
		out = append(out, migration{version: v, name: strings.TrimSuffix(name, ".up.sql"), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate applies the embedded migrations not yet recorded in
// schema_migrations, in order, each in its own transaction. A session
// advisory lock makes concurrent callers (several creditd processes starting
// at once) run one after another; the later ones find nothing left to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := migrations()
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

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("persist: migrate: create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("persist: migrate: read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("persist: migrate: read schema_migrations: %w", err)
	}
	for _, v := range versions {
		applied[int(v)] = true
	}
	if st := statusOf(ms, applied); len(st.Unknown) > 0 {
		return st.Check()
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn.Conn(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("persist: migrate: apply %s: %w", m.name, err)
		}
	}
	return nil
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
	if exists {
		rows, err := pool.Query(ctx, "SELECT version FROM schema_migrations")
		if err != nil {
			return SchemaStatus{}, fmt.Errorf("persist: schema: read schema_migrations: %w", err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return SchemaStatus{}, fmt.Errorf("persist: schema: read schema_migrations: %w", err)
		}
		for _, v := range versions {
			applied[int(v)] = true
		}
	}
	return statusOf(ms, applied), nil
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
