package api

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// registerSnapshot adds the entitlement snapshot routes (docs/spec/interface.md
// Entitlement checks): lenient by id (creates an unknown customer) and
// strict by external id (404).
func (s *Server) registerSnapshot() {
	s.handle("GET", "/v1/customers/{id}/entitlements", optTenant, s.snapshot(refParam(false)))
	s.handle("GET", "/v1/customer-by-external-id/{external_id}/entitlements", optTenant, s.snapshot(refParam(true)))
}

var noCache = []byte("no-cache")

// wantsFresh reports whether Cache-Control carries the no-cache directive.
func wantsFresh(ctx *fasthttp.RequestCtx) bool {
	for _, d := range bytes.Split(ctx.Request.Header.Peek("Cache-Control"), []byte(",")) {
		if name, _, _ := bytes.Cut(bytes.TrimSpace(d), []byte("=")); bytes.EqualFold(name, noCache) {
			return true
		}
	}
	return false
}

// snapshot answers GET .../entitlements with the customer's whole
// entitlement picture, up to 30 s old unless Cache-Control: no-cache.
func (s *Server) snapshot(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		snap, err := s.entitlements.Snapshot(c.reqContext(), c.scope, c.tenant, r, wantsFresh(c.ctx))
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, snap)
	}
}
