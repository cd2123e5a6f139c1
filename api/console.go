package api

import (
	"io"

	"github.com/prometheus/common/expfmt"
	"github.com/valyala/fasthttp"
)

// consolePath is the route template the console's requests are logged and
// counted under (the console routes within itself).
const consolePath = "/console"

// registerConsole serves cfg.Console under /console, behind the request id,
// access log, metrics and panic recovery every request gets (the console
// does its own sign-in). Its routes are not in Routes(): they are no part
// of the JSON API that api/openapi.json documents.
func (s *Server) registerConsole(h fasthttp.RequestHandler) {
	if h == nil {
		return
	}
	for _, method := range []string{fasthttp.MethodGet, fasthttp.MethodPost} {
		rt := &route{method: method, path: consolePath, metrics: s.metrics.route(consolePath, method)}
		serve := func(ctx *fasthttp.RequestCtx) {
			s.callOf(ctx).route = rt
			h(ctx)
		}
		s.router.Handle(method, consolePath, serve)
		s.router.Handle(method, consolePath+"/{path:*}", serve)
		if method == fasthttp.MethodGet {
			s.consoleRoot = serve
		}
	}
}

// consoleRootPath is the console's home with a trailing slash, which the
// router's catch-all does not match (it needs at least one byte after the
// slash); notFound hands it to the console.
const consoleRootPath = consolePath + "/"

// WriteMetrics writes the Prometheus text GET /metrics serves (the
// console's overview samples it), whichever listener serves /metrics.
func (s *Server) WriteMetrics(w io.Writer) {
	mfs, err := s.registry.Gather()
	if err != nil {
		s.log.Warn().Err(err).Msg("metrics: gather")
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return
		}
	}
}
