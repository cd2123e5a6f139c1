package api

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/valyala/fasthttp"
)

// openAPIDocument is the hand-written OpenAPI 3.1 description of every route
// register serves; a test keeps the two in step.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns a copy of the served OpenAPI document (api/openapi.json):
// the e2e response checker and the API reference generator read the same
// bytes creditd serves.
func OpenAPI() []byte { return append([]byte(nil), openAPIDocument...) }

// healthz answers 200 while the process runs.
func (s *Server) healthz(c *call) error {
	c.ctx.SetStatusCode(fasthttp.StatusOK)
	c.ctx.Response.Header.SetContentTypeBytes(contentJSON)
	c.ctx.SetBodyString(`{"status":"ok"}`)
	return nil
}

// NotReady is a readiness failure whose text /readyz may show: /readyz needs
// no key, so any other error (a dial error naming hosts and ports) is
// answered as "unavailable" and its text goes to the log only.
type NotReady string

// Error is the public text of the failure.
func (e NotReady) Error() string { return string(e) }

// readyBody is the /readyz answer: each check's "ok" or its error.
type readyBody struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

// publicReadyText is what /readyz shows of a failed check.
func publicReadyText(err error) string {
	if nr, ok := err.(NotReady); ok {
		return string(nr)
	}
	return "unavailable"
}

// readyz runs every readiness check at once, each bounded by 2 s (a check
// that ignores its context is reported as timed out, not waited for); any
// failure but an advisory check's makes the answer 503 so a load balancer
// stops sending traffic.
func (s *Server) readyz(c *call) error {
	type result struct {
		name     string
		err      error
		advisory bool
	}
	results := make(chan result, len(s.ready)) // buffered: a late check never blocks
	for _, hc := range s.ready {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
			defer cancel()
			results <- result{hc.Name, hc.Check(ctx), hc.Advisory}
		}()
	}
	body := readyBody{Status: "ready", Checks: make(map[string]string, len(s.ready))}
	for _, hc := range s.ready {
		body.Checks[hc.Name] = "check timed out"
	}
	timeout := time.NewTimer(readyCheckTimeout + 100*time.Millisecond)
	defer timeout.Stop()
	ok := true
	answered := make(map[string]bool, len(s.ready))
collect:
	for range s.ready {
		select {
		case r := <-results:
			answered[r.name] = true
			if r.err != nil {
				body.Checks[r.name] = publicReadyText(r.err)
				if _, public := r.err.(NotReady); !public {
					s.log.Warn().Bytes("request_id", c.reqID).Str("check", r.name).Err(r.err).Msg("readiness check failed")
				}
				ok = ok && r.advisory
				continue
			}
			body.Checks[r.name] = "ok"
		case <-timeout.C:
			for _, hc := range s.ready {
				ok = ok && (answered[hc.Name] || hc.Advisory)
			}
			break collect
		}
	}
	if !ok {
		body.Status = "unavailable"
		return c.json(fasthttp.StatusServiceUnavailable, body)
	}
	return c.json(fasthttp.StatusOK, body)
}

// metricsText renders every family of the registry in the Prometheus
// text format. A collector that fails (a store down at scrape time) leaves
// its families out; the others are still served.
func (s *Server) metricsText(c *call) error {
	ctx := c.ctx
	mfs, err := s.registry.Gather()
	if err != nil {
		s.log.Warn().Err(err).Msg("metrics: gather")
	}
	ctx.ResetBody()
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	enc := expfmt.NewEncoder(ctx.Response.BodyWriter(), format)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.SetContentType(string(format))
	return nil
}

// openAPI serves the embedded OpenAPI document.
func (s *Server) openAPI(c *call) error {
	c.ctx.SetStatusCode(fasthttp.StatusOK)
	c.ctx.Response.Header.SetContentTypeBytes(contentJSON)
	c.ctx.SetBody(openAPIDocument)
	return nil
}

// adminAuthorized checks "Authorization: Bearer <token>" in constant time.
func (s *Server) adminAuthorized(ctx *fasthttp.RequestCtx) bool {
	const prefix = "Bearer "
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	if len(h) <= len(prefix) || string(h[:len(prefix)]) != prefix {
		return false
	}
	return subtle.ConstantTimeCompare(h[len(prefix):], s.admin) == 1
}
