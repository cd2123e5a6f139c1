package api

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// getCredits answers GET .../credits with the balance snapshot.
func (s *Server) getCredits(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		blocks, err := c.queryBool("include_blocks")
		if err != nil {
			return err
		}
		if c.ctx.QueryArgs().Has("as_of") {
			at, err := time.Parse(time.RFC3339Nano, c.query("as_of"))
			if err != nil {
				return engine.BadRequest("as_of", "as_of must be an RFC 3339 date-time")
			}
			acct, err := s.credits.AccountAsOf(c.reqContext(), c.scope, r, at)
			if err != nil {
				return err
			}
			return c.json(fasthttp.StatusOK, acct)
		}
		byScope, err := c.queryBool("by_scope")
		if err != nil {
			return err
		}
		acct, err := s.credits.Account(c.reqContext(), c.scope, r, blocks || byScope)
		if err != nil {
			return err
		}
		if byScope {
			acct.ByScope = s.credits.ScopeBalances(acct.Blocks)
			if !blocks {
				acct.Blocks = []engine.Block{}
			}
		}
		return c.json(fasthttp.StatusOK, acct)
	}
}

// grant answers POST .../credits/grant with 201.
func (s *Server) grant(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		var in GrantPayload
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		cmd, err := in.ToCommand()
		if err != nil {
			return err
		}
		res, err := s.credits.Grant(c.reqContext(), c.scope, r, c.idem, cmd)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusCreated, res)
	}
}

// adjust answers POST .../credits/adjust with 200.
func (s *Server) adjust(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		var in adjustPayload
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		cmd, err := in.toCommand()
		if err != nil {
			return err
		}
		res, err := s.credits.Adjust(c.reqContext(), c.scope, r, c.idem, cmd)
		if err != nil {
			return err
		}
		if res.Transactions == nil {
			res.Transactions = []engine.LedgerEntry{}
		}
		return c.json(fasthttp.StatusOK, res)
	}
}

// history answers GET .../credits/history, newest first.
func (s *Server) history(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		limit, err := c.queryLimit()
		if err != nil {
			return err
		}
		q, err := (&HistoryParams{
			Type: c.query("type"), Source: c.query("source"), BillableMetricKey: c.query("billable_metric_key"),
			From: c.query("from"), To: c.query("to"), Cursor: c.query("cursor"), Limit: limit,
		}).ToQuery()
		if err != nil {
			return err
		}
		page, err := s.credits.History(c.reqContext(), c.scope, r, q)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, pageOf(page))
	}
}

// overage answers GET .../overage for [from, to).
func (s *Server) overage(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		rep, err := s.credits.Overage(c.reqContext(), c.scope, r, c.query("from"), c.query("to"))
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, rep)
	}
}

// adjustPayload is the body of the adjust endpoints.
type adjustPayload struct {
	Delta    *int64          `json:"delta"`
	Source   *string         `json:"source"`
	Reason   *string         `json:"reason"`
	Metadata engine.Metadata `json:"metadata"`
}

// toCommand checks the body, naming the first wrong member.
func (in *adjustPayload) toCommand() (engine.AdjustCredits, error) {
	if in.Delta == nil {
		return engine.AdjustCredits{}, engine.Invalid("delta", "delta is required and must not be 0")
	}
	if err := engine.CheckAdjustDelta(*in.Delta); err != nil {
		return engine.AdjustCredits{}, err
	}
	if err := engine.ValidateSourceReason(in.Source, in.Reason); err != nil {
		return engine.AdjustCredits{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.AdjustCredits{}, err
	}
	return engine.AdjustCredits{Delta: *in.Delta, Source: engine.Source(*in.Source), Reason: *in.Reason, Metadata: meta}, nil
}

// HistoryParams is the query of the history endpoint as sent ("" for an
// absent parameter); the console's ledger page builds one too.
type HistoryParams struct {
	Type, Source, BillableMetricKey string
	From, To                        string
	Cursor                          string
	Limit                           int
}

// ToQuery checks the parameters (400 naming a bad from or to).
func (in *HistoryParams) ToQuery() (engine.HistoryQuery, error) {
	q := engine.HistoryQuery{Cursor: in.Cursor, Limit: in.Limit}
	var err error
	if q.From, err = engine.ParseOptionalTime("from", in.From, engine.KindBadRequest); err != nil {
		return engine.HistoryQuery{}, err
	}
	if q.To, err = engine.ParseOptionalTime("to", in.To, engine.KindBadRequest); err != nil {
		return engine.HistoryQuery{}, err
	}
	if in.Type != "" {
		t := engine.EntryType(in.Type)
		q.Type = &t
	}
	if in.Source != "" {
		src := engine.Source(in.Source)
		q.Source = &src
	}
	if in.BillableMetricKey != "" {
		k := in.BillableMetricKey
		q.BillableMetricKey = &k
	}
	return q, nil
}

// GrantPayload is the body of the grant endpoints; the console's grant form
// builds one too.
type GrantPayload struct {
	Credits         *int64             `json:"credits"`
	Source          *string            `json:"source"`
	Reason          *string            `json:"reason"`
	ExpiresAt       *string            `json:"expires_at"`
	DurationSeconds *int64             `json:"duration_seconds"`
	StackAfter      *stackAfterPayload `json:"stack_after"`
	Priority        *int64             `json:"priority"`
	Metadata        engine.Metadata    `json:"metadata"`
	AppliesTo       *engine.AppliesTo  `json:"applies_to"`
}

// stackAfterPayload is the stack_after object of a grant body.
type stackAfterPayload struct {
	MetadataMatch engine.Metadata `json:"metadata_match"`
	Fallback      *string         `json:"fallback"`
}

// ToCommand checks the body, naming the first wrong member; an expiry in
// the past is the engine's to refuse, and so named before a stack_after
// without duration_seconds (the command's StackErr).
func (in *GrantPayload) ToCommand() (engine.GrantCredits, error) {
	var cmd engine.GrantCredits
	if in.Credits == nil {
		return cmd, engine.Invalid("credits", "credits is required")
	}
	if err := engine.GrantAmount.Check("", *in.Credits); err != nil {
		return cmd, err
	}
	if err := engine.ValidateSourceReason(in.Source, in.Reason); err != nil {
		return cmd, err
	}
	if in.Priority != nil && (*in.Priority < 0 || *in.Priority > engine.MaxPriority) {
		return cmd, engine.Invalid("priority", "priority must be between 0 and 255")
	}
	if in.ExpiresAt != nil && in.DurationSeconds != nil {
		return cmd, engine.Invalid("expires_at", "give expires_at or duration_seconds, not both")
	}
	if in.DurationSeconds != nil && (*in.DurationSeconds < 1 || *in.DurationSeconds > engine.MaxDurationSeconds) {
		return cmd, engine.Invalid("duration_seconds", "duration_seconds must be between 1 and 315360000")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return cmd, err
	}
	scope, err := engine.ScopeKeys("applies_to", in.AppliesTo)
	if err != nil {
		return cmd, err
	}
	cmd = engine.GrantCredits{Credits: *in.Credits, Source: engine.Source(*in.Source), Reason: *in.Reason, Metadata: meta,
		Scope: scope}
	if in.Priority != nil {
		cmd.Priority = int(*in.Priority)
	}
	if in.DurationSeconds != nil {
		cmd.DurationSeconds = *in.DurationSeconds
	}
	if in.ExpiresAt != nil {
		t, err := engine.ParseInstant("expires_at", *in.ExpiresAt, engine.KindValidation)
		if err != nil {
			return engine.GrantCredits{}, err
		}
		t = t.UTC().Truncate(time.Millisecond)
		cmd.ExpiresAt = &t
	}
	if in.StackAfter == nil {
		return cmd, nil
	}
	if in.DurationSeconds == nil {
		// Only expires_at can be set here, and its check comes first.
		cmd.StackErr = engine.Invalid("duration_seconds", "stack_after requires duration_seconds")
		return cmd, nil
	}
	if in.StackAfter.MetadataMatch == nil {
		return engine.GrantCredits{}, engine.Invalid("stack_after.metadata_match", "stack_after.metadata_match is required")
	}
	match, err := in.StackAfter.MetadataMatch.Canonical("stack_after.metadata_match")
	if err != nil {
		return engine.GrantCredits{}, err
	}
	fb := engine.FallbackNow
	if in.StackAfter.Fallback != nil {
		fb = *in.StackAfter.Fallback
	}
	if fb != engine.FallbackNow && fb != engine.FallbackReject {
		return engine.GrantCredits{}, engine.Invalid("stack_after.fallback", "stack_after.fallback must be now or reject")
	}
	cmd.StackAfter = &engine.StackAfter{MetadataMatch: match, Fallback: fb}
	return cmd, nil
}
