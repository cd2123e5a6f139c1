package api

import (
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
		acct, err := s.credits.Account(c.reqContext(), c.scope, r, blocks)
		if err != nil {
			return err
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
		var in engine.GrantInput
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		res, err := s.credits.Grant(c.reqContext(), c.scope, r, c.idem, in)
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
		var in engine.AdjustInput
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		res, err := s.credits.Adjust(c.reqContext(), c.scope, r, c.idem, in)
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
		page, err := s.credits.History(c.reqContext(), c.scope, r, engine.HistoryInput{
			Type: c.query("type"), Source: c.query("source"), BillableMetricKey: c.query("billable_metric_key"),
			From: c.query("from"), To: c.query("to"), Cursor: c.query("cursor"), Limit: limit,
		})
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
