package persist

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// forgetTimeout bounds the op-key round trip after a commit.
const forgetTimeout = 5 * time.Second

// forgetOps shortens the op keys of ms, just committed from partition part,
// to engine.OpKeyGrace (issue 10: Redis keeps no op key past its commit by
// more than the grace; Postgres answers retries from then on). Only
// committed mutations get here, never a dead-lettered one, so an op key
// Redis no longer holds always has its operation in Postgres. A failure
// is harmless: the keys lapse with their own TTL (engine.OpKeyRetention).
func (p *Persister) forgetOps(ctx context.Context, log zerolog.Logger, part int, ms []engine.Mutation) {
	f, ok := p.outbox.(engine.OpRecords)
	if !ok {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forgetTimeout)
	defer cancel()
	if err := f.ForgetOps(fctx, part, ms); err != nil {
		log.Warn().Err(err).Int("count", len(ms)).Msg("shortening op keys after commit failed; they lapse with their TTL")
	}
}
