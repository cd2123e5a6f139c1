package persist

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// forgetTimeout bounds the op-key round trip after a commit.
const forgetTimeout = 5 * time.Second

// forgetOps records the op keys of ms, just committed from partition part,
// in the seen filter and shortens them to idempotency.OpKeyGrace (issue 10:
// Redis keeps no op key past its commit by more than the grace; issue 26:
// the filter tells a retry it may have been applied). Only committed
// mutations get here, never a dead-lettered one. It is tried again until
// it works or ctx ends (then false: the batch is not acknowledged, so it
// is read, written again, which changes nothing, and forgotten again): a
// key that lapsed without entering the filter could be applied twice.
func (p *Persister) forgetOps(ctx context.Context, log zerolog.Logger, part int, ms []engine.Mutation) bool {
	f, ok := p.outbox.(engine.OpRecords)
	if !ok {
		return true
	}
	backoff := newBackoff()
	for {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forgetTimeout)
		err := f.ForgetOps(fctx, part, ms)
		cancel()
		if err == nil {
			return true
		}
		log.Warn().Err(err).Int("count", len(ms)).Msg("recording committed op keys failed; trying again")
		backoff.wait(ctx)
		if ctx.Err() != nil {
			return false
		}
	}
}
