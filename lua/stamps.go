package lua

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store keeps the fleet's change stamps.
var _ engine.ChangeStamps = (*Store)(nil)

var (
	//go:embed stamp.lua
	stampLua    string
	stampScript = newScript("stamp", stampLua)
)

// stampsKey is tenant's change stamps, a hash of one field per
// engine.StampKind under the tenant's hash tag (uuid.Nil: the fleet's key
// creations). One per tenant, never expired: a few dozen bytes each.
func (s *Store) stampsKey(tenant uuid.UUID) string {
	return s.tenantKey(tenant, ":stamps")
}

// StampsRead is tenant's stamps with one HMGET, sent with concurrent
// requests' commands when round trips are busy (coalescer): the one Redis
// read a request adds for them. A stamp never moved reads 0.
// Errors are Redis' (the caller then leaves its caches to their TTLs).
func (s *Store) StampsRead(ctx context.Context, tenant uuid.UUID) (engine.TenantStamps, error) {
	cmd := s.stampsCmd(ctx, tenant)
	if err := s.trips.do(ctx, cmd); err != nil {
		return engine.TenantStamps{}, fmt.Errorf("lua: read change stamps: %w", err)
	}
	return stampsReply(cmd)
}

// stampsCmd is the HMGET of tenant's stamps (StampsRead, DoorTrip).
func (s *Store) stampsCmd(ctx context.Context, tenant uuid.UUID) *redis.SliceCmd {
	args := make([]any, 0, 2+engine.StampKinds)
	args = append(args, "hmget", s.stampsKey(tenant))
	for _, f := range engine.StampFields() {
		args = append(args, f)
	}
	return redis.NewSliceCmd(ctx, args...)
}

// stampsReply reads an answered stampsCmd.
func stampsReply(cmd *redis.SliceCmd) (engine.TenantStamps, error) {
	if err := cmd.Err(); err != nil {
		return engine.TenantStamps{}, fmt.Errorf("lua: read change stamps: %w", err)
	}
	var out engine.TenantStamps
	for i, v := range cmd.Val() {
		if i >= len(out) || v == nil {
			continue
		}
		str, ok := v.(string)
		if !ok {
			return engine.TenantStamps{}, fmt.Errorf("lua: change stamp %s is %T, want a string", engine.StampKind(i), v)
		}
		n, err := strconv.ParseUint(str, 10, 64)
		if err != nil {
			return engine.TenantStamps{}, fmt.Errorf("lua: change stamp %s: %w", engine.StampKind(i), err)
		}
		out[i] = n
	}
	return out, nil
}

// StampBump moves tenant's stamp of kind past every value it had, with one
// call of stamp.lua, and returns the new value. A kind that alters
// checks (StampKind.Fed) is appended to the tenant's change feed in the
// same script, so the feed holds every bump the caches saw.
func (s *Store) StampBump(ctx context.Context, tenant uuid.UUID, kind engine.StampKind) (uint64, error) {
	if kind >= engine.StampKinds {
		return 0, fmt.Errorf("lua: change stamp: no kind %d", kind)
	}
	keys, args := []string{s.stampsKey(tenant)}, []any{kind.String()}
	if kind.Fed() && tenant != uuid.Nil {
		keys, args = append(keys, s.changesKey(tenant)), append(args, engine.ChangeFeedCap,
			s.wakeChannel(), wakeChangesMessage(tenant))
	}
	v, err := s.call(ctx, stampScript, keys, args...).Text()
	if err != nil {
		return 0, fmt.Errorf("lua: move change stamp %s: %w", kind, err)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("lua: move change stamp %s: reply %q: %w", kind, v, err)
	}
	return n, nil
}
