package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAnyAnswers: the cluster's redis readiness check passes as soon as
// one master answers PING, without waiting for a dead master's timeout,
// and fails only when none answers or none is known (issue 25: one shard
// in failover must not fail readiness on every node).
func TestAnyAnswers(t *testing.T) {
	t.Parallel()
	errDown := errors.New("connection refused")
	const (
		up   = "up"
		down = "down"
		hang = "hang" // answers nothing until its context ends
	)
	for _, tc := range []struct {
		name    string
		masters []string
		want    error // nil, or the error wanted (errors.Is)
	}{
		{"every master up", []string{up, up, up}, nil},
		{"one master down", []string{down, up, up}, nil},
		{"one master hangs", []string{hang, up, down}, nil},
		{"only the last answers", []string{down, hang, up}, nil},
		{"every master down", []string{down, down, down}, errDown},
		{"no master known", nil, errNoMaster},
		{"every master hangs", []string{hang, hang}, context.DeadlineExceeded},
		{"down or hanging", []string{down, hang}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			masters := make([]*redis.Client, len(tc.masters))
			behaviour := map[*redis.Client]string{}
			for i, b := range tc.masters {
				masters[i] = new(redis.Client)
				behaviour[masters[i]] = b
			}
			ping := func(ctx context.Context, c *redis.Client) error {
				switch behaviour[c] {
				case up:
					return nil
				case down:
					return errDown
				}
				<-ctx.Done()
				return ctx.Err()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := anyAnswers(ctx, masters, ping)
			took := time.Since(start)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("err = %v, want nil", err)
			case tc.want == nil && took > 200*time.Millisecond:
				t.Errorf("took %s: it waited for a master that does not answer", took)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
