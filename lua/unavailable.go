package lua

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// UnavailableError is a Redis failure that says nothing about the data,
// only that Redis could not answer now: a dead or unreachable node, a
// broken connection, a timeout, or a cluster slot without a master. It
// matches engine.ErrUnavailable (a 503 with Retry-After) and still unwraps
// to the go-redis error; its text is that error's, so logs and prefix
// checks read as before.
type UnavailableError struct{ Err error }

// Error implements error.
func (e *UnavailableError) Error() string { return e.Err.Error() }

// Unwrap exposes engine.ErrUnavailable and the Redis error.
func (e *UnavailableError) Unwrap() []error { return []error{engine.ErrUnavailable, e.Err} }

// transientReplies are the Redis reply prefixes of a cluster in failover:
// the slot has no master (CLUSTERDOWN), is moving (TRYAGAIN, MOVED and ASK
// past go-redis' redirect limit), or the node is not (yet) the master
// (READONLY, MASTERDOWN, LOADING, NOREPLICAS); or it refuses writes for
// now (OOM: maxmemory reached under noeviction, issue 25). Redis refuses a
// script that may write before it runs a line of it, so nothing is half
// applied and no outbox entry is lost: the retry applies it once.
var transientReplies = []string{"CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "READONLY", "MASTERDOWN", "LOADING", "NOREPLICAS", "OOM"}

// Unavailable tells whether err is a transient Redis failure (see
// UnavailableError). redis.Nil, script errors and context.Canceled are not.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	code, _, _ := strings.Cut(rerr.Error(), " ")
	for _, p := range transientReplies {
		if code == p {
			return true
		}
	}
	return false
}

// unavailableHook turns transient failures of every command into
// *UnavailableError after go-redis' own retries and redirects, and asks a
// cluster client for a fresh slot map: go-redis reloads it on MOVED, but a
// dead master sends none, and the periodic reload (60 s) would keep
// sending its slots' commands to it long after its replica took over.
type unavailableHook struct{ reload func() }

// hooked are the clients withUnavailable already installed the hook on
// (several Stores share one client).
var hooked sync.Map // redis.UniversalClient -> unavailableHook

// withUnavailable installs on rdb, once, the hook that makes transient
// Redis failures match engine.ErrUnavailable (the API answers 503 with
// Retry-After, never a 500) and refreshes a cluster client's slot map when
// one happens, so commands follow a promoted replica within a reload
// (go-redis coalesces reloads, at most one per 200 ms). It returns the
// hook, whose classify also serves what bypasses the client's hooks (the
// replica-acknowledged scripts run on a node's own client).
func withUnavailable(rdb redis.UniversalClient) unavailableHook {
	if rdb == nil {
		// A Store without a client builds keys only.
		return unavailableHook{reload: func() {}}
	}
	if h, ok := hooked.Load(rdb); ok {
		return h.(unavailableHook)
	}
	h := unavailableHook{reload: func() {}}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		h.reload = func() { c.ReloadState(context.Background()) }
	}
	if prev, loaded := hooked.LoadOrStore(rdb, h); loaded {
		return prev.(unavailableHook)
	}
	rdb.AddHook(h)
	return h
}

// DialHook implements redis.Hook.
func (h unavailableHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h unavailableHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.classify(next(ctx, cmd))
	}
}

// ProcessPipelineHook implements redis.Hook: each command's error is
// classified, as callers read them one by one.
func (h unavailableHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if cerr := c.Err(); cerr != nil {
				if wrapped := h.classify(cerr); wrapped != cerr {
					c.SetErr(wrapped)
				}
			}
		}
		return h.classify(err)
	}
}

// classify wraps a transient err (once) and triggers the slot map reload.
func (h unavailableHook) classify(err error) error {
	if !Unavailable(err) {
		return err
	}
	h.reload()
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return err
	}
	return &UnavailableError{Err: err}
}
