package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/pgserver"
)

// PostgresServer is a private Postgres an outage test can stop and start
// again (issue 25; internal/pgserver runs it). It is removed when the test
// ends.
type PostgresServer struct {
	*pgserver.Server
	t testing.TB
}

// StartPostgres initdbs and starts a private Postgres. The test fails when
// it cannot (make test installs PostgreSQL).
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.New(ctx, 100)
	if srv != nil {
		t.Cleanup(srv.Remove)
	}
	if err != nil {
		t.Fatalf("testenv: private postgres: %v", err)
	}
	return &PostgresServer{Server: srv, t: t}
}

// Start starts the stopped server again and waits until it answers.
func (s *PostgresServer) Start() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Server.Start(ctx); err != nil {
		s.t.Fatalf("testenv: restart postgres: %v", err)
	}
}
