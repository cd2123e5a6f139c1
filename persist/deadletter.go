package persist

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// DeadLetters keeps outbox entries that can never be persisted. A Persister
// whose writer also implements it sets such entries aside and acknowledges
// them instead of retrying them for ever; *Store implements it.
type DeadLetters interface {
	// DeadLetter stores entry entryID of outbox partition with its raw
	// bytes and why it failed.
	DeadLetter(ctx context.Context, partition int, entryID string, raw []byte, reason string) error
}

var _ DeadLetters = (*Store)(nil)

// DeadLetter stores one unpersistable outbox entry in outbox_dead_letters.
func (s *Store) DeadLetter(ctx context.Context, partition int, entryID string, raw []byte, reason string) error {
	if raw == nil {
		raw = []byte{}
	}
	// TEXT refuses NUL and invalid UTF-8; the reason is for humans only.
	reason = strings.ReplaceAll(strings.ToValidUTF8(reason, "?"), "\x00", "?")
	_, err := s.pool.Exec(ctx, `INSERT INTO outbox_dead_letters (partition, entry_id, raw, error)
		VALUES ($1, $2, $3, $4)`, partition, entryID, raw, reason)
	if err != nil {
		return fmt.Errorf("persist: dead letter %d/%s: %w", partition, entryID, err)
	}
	return nil
}

// malformedEntry is how an Outbox reports an entry it cannot decode
// (lua.MalformedEntryError), seen through errors.As without importing lua.
type malformedEntry interface {
	OutboxEntryID() string
	RawEntry() []byte
}

// refusedData reports whether Postgres refused err's statement for its
// data (SQLSTATE classes 22 data exception and 23 integrity violation):
// retrying the same rows can never succeed. Everything else (connection,
// timeout, serialization, a schema not migrated) may pass on a retry.
func refusedData(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")
}
