package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Gauge leases (engine/leases.go): lease.lua renews, releases and expires
// them; gauge.lua takes them; gauge_value.lua reads a count past lapsed
// ones; Load restores the active ones (field "L:<metric>").

// Compile-time check that Store runs the lease script.
var _ engine.LeaseStore = (*Store)(nil)

var (
	//go:embed lease.lua
	leaseLua    string
	leaseScript = newScript("lease", leaseLua)
)

// leaseErrors are the codes of gauge.lua and lease.lua for leases, kept
// apart from scriptErrors (whose NOTFOUND names a reservation).
var leaseErrors = map[string]error{
	"LEASENOTFOUND": engine.ErrLeaseNotFound,
	"LEASEENDED":    engine.ErrLeaseEnded,
	"LEASENOTDUE":   engine.ErrLeaseNotDue,
	"LEASED":        engine.ErrGaugeLeased,
	"TOOMANYLEASES": engine.ErrTooManyLeases,
}

// leaseError is err with a lease code of a script's error reply turned
// into its engine error; any other error is returned as it is.
func leaseError(err error) error {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return err
	}
	code, _, _ := strings.Cut(rerr.Error(), " ")
	if e, ok := leaseErrors[code]; ok {
		return e
	}
	return err
}

// Lease renews, releases or expires cmd.LeaseID of gauge cmd.Metric
// (lease.lua); every lease of the gauge past its expires lapses on the
// way. Errors: engine.ErrLeaseNotFound, ErrLeaseEnded, ErrLeaseNotDue,
// ErrIdempotencyMismatch, ErrStateMissing.
func (s *Store) Lease(ctx context.Context, cmd engine.LeaseCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.lease(ctx, cmd) })
}

// lease is Lease once Postgres does not hold the key (appliedFirst).
func (s *Store) lease(ctx context.Context, cmd engine.LeaseCommand) (engine.MutationResult, error) {
	if err := checkMetric(cmd.Metric); err != nil {
		return engine.MutationResult{}, fmt.Errorf("lua: lease: %w", err)
	}
	switch cmd.Action {
	case engine.LeaseRenew, engine.LeaseRelease, engine.LeaseExpire:
	default:
		return engine.MutationResult{}, fmt.Errorf("lua: lease: action %q", cmd.Action)
	}
	head, err := newHotHead(cmd.CommandHeader, cmd.Context)
	if err != nil {
		return engine.MutationResult{}, err
	}
	a := leaseArgv{hotHead: head, Metric: cmd.Metric, LeaseID: cmd.LeaseID.String(), Action: string(cmd.Action)}
	if cmd.Seconds > 0 {
		a.Seconds = strconv.FormatInt(cmd.Seconds, 10)
	}
	res, err := s.runMoney(ctx, leaseScript, "lease", s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list())
	return res, leaseError(err)
}

// leaseFields are the "L:<metric>" fields of a rebuilt hash: the active
// leases of each gauge in lease.lua's encoding, oldest first.
func leaseFields(leases []engine.StoredLease) ([]any, error) {
	by := map[string][]engine.StoredLease{}
	for _, l := range leases {
		if err := checkMetric(l.Metric); err != nil {
			return nil, fmt.Errorf("lua: load: lease %s: %w", l.ID, err)
		}
		if l.Status != engine.LeaseActive {
			continue
		}
		by[l.Metric] = append(by[l.Metric], l)
	}
	metrics := make([]string, 0, len(by))
	for m := range by {
		metrics = append(metrics, m)
	}
	sort.Strings(metrics)
	var out []any
	for _, m := range metrics {
		ls := by[m]
		sort.Slice(ls, func(i, j int) bool { return ls[i].CreatedMS < ls[j].CreatedMS })
		parts := make([]string, len(ls))
		for i, l := range ls {
			parts[i] = l.ID.String() + "," + dec(l.Amount) + "," + dec(l.ExpiresMS) + "," + dec(l.CreatedMS) + "," + dec(l.Seconds)
		}
		out = append(out, "L:"+m, strings.Join(parts, " "))
	}
	return out, nil
}
