package persist

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable tells whether err says only that Postgres could not answer
// now (issue 25: a part that is down gets 503 with Retry-After, never a
// 500): no connection could be made or it broke, the server is shutting
// down, starting, or out of connections, or a query timed out waiting for
// one. An error about the data or the statement is not. internal/app hands
// it to the API, which answers such an error 503.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// 08: connection exception; 57P01..57P05: shut down by an operator
		// or a crash, cannot connect now, idle session timeout, ...;
		// 53300: too many connections.
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P") || pe.Code == "53300"
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "closed pool")
}
