package lua

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// sourceNames undoes prelude.lua's one-letter source codes.
var sourceNames = map[string]engine.Source{
	"p": engine.SourcePlanGrant, "t": engine.SourceTopup, "o": engine.SourcePromotional,
	"c": engine.SourceCompensation, "r": engine.SourceReferral, "m": engine.SourceManual,
	"g": engine.SourceMigration,
}

// accountFields is an account hash read by Go: the read path of checks and
// balance snapshots is a plain HGETALL decoded here, not a script, because
// a script's Lua decoding costs Redis several times the HGETALL itself.
type accountFields struct {
	id             string
	version        int64
	reserved       int64
	lifetimeEarned int64
	updatedMS      int64
	blocks         []engine.MutationBlock
}

// readAccount HGETALLs a customer's hash; engine.ErrStateMissing when absent.
func (s *Store) readAccount(ctx context.Context, key string) (accountFields, error) {
	raw, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return accountFields{}, fmt.Errorf("lua: read account: %w", err)
	}
	if len(raw) == 0 {
		return accountFields{}, engine.ErrStateMissing
	}
	return decodeAccount(raw)
}

// decodeAccount reads the fields prelude.lua's acct_commit writes.
func decodeAccount(raw map[string]string) (accountFields, error) {
	var a accountFields
	var err error
	for f, v := range raw {
		switch {
		case strings.HasPrefix(f, "m:"):
			// Block metadata (prelude.lua): joined to its block below.
		case strings.HasPrefix(f, "b:"):
			b, berr := decodeBlock(f[2:], v)
			if berr != nil {
				return accountFields{}, berr
			}
			a.blocks = append(a.blocks, b)
		case f == "id":
			a.id = v
		case f == "v":
			a.version, err = strconv.ParseInt(v, 10, 64)
		case f == "rs":
			a.reserved, err = strconv.ParseInt(v, 10, 64)
		case f == "le":
			a.lifetimeEarned, err = strconv.ParseInt(v, 10, 64)
		case f == "ua":
			a.updatedMS, err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			return accountFields{}, fmt.Errorf("lua: account field %s: %w", f, err)
		}
	}
	for i := range a.blocks {
		b := &a.blocks[i]
		if meta, ok := raw["m:"+b.ID.String()]; ok && meta != "" {
			b.Metadata = json.RawMessage(meta)
		}
	}
	return a, nil
}

// decodeBlock reads block_enc's "rem|orig|prio|created36|starts-created36|
// expires-starts36|source|meta" (meta "" since metadata moved to field
// "m:<id>"; older hashes still hold it inline).
func decodeBlock(id, raw string) (engine.MutationBlock, error) {
	p := strings.SplitN(raw, "|", 8)
	if len(p) != 8 {
		return engine.MutationBlock{}, fmt.Errorf("lua: block %s: malformed", id)
	}
	var b engine.MutationBlock
	var err error
	if b.ID, err = uuid.Parse(id); err != nil {
		return b, fmt.Errorf("lua: block id %q: %w", id, err)
	}
	if b.Remaining, err = strconv.ParseInt(p[0], 10, 64); err != nil {
		return b, fmt.Errorf("lua: block %s remaining: %w", id, err)
	}
	if b.Original, err = strconv.ParseInt(p[1], 10, 64); err != nil {
		return b, fmt.Errorf("lua: block %s original: %w", id, err)
	}
	prio, err := strconv.Atoi(p[2])
	if err != nil {
		return b, fmt.Errorf("lua: block %s priority: %w", id, err)
	}
	b.Priority = prio
	if b.CreatedMS, err = strconv.ParseInt(p[3], 36, 64); err != nil {
		return b, fmt.Errorf("lua: block %s created: %w", id, err)
	}
	b.StartsMS = b.CreatedMS
	if p[4] != "" {
		off, err := strconv.ParseInt(p[4], 36, 64)
		if err != nil {
			return b, fmt.Errorf("lua: block %s starts: %w", id, err)
		}
		b.StartsMS += off
	}
	if p[5] != "" {
		off, err := strconv.ParseInt(p[5], 36, 64)
		if err != nil {
			return b, fmt.Errorf("lua: block %s expires: %w", id, err)
		}
		exp := b.StartsMS + off
		b.ExpiresMS = &exp
	}
	if name, ok := sourceNames[p[6]]; ok {
		b.Source = name
	} else {
		b.Source = engine.Source(p[6])
	}
	if p[7] != "" {
		b.Metadata = json.RawMessage(p[7])
	}
	return b, nil
}
