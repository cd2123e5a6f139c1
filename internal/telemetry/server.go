package telemetry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// metricsServerTimeout bounds reading a scrape request and writing its
// answer on the metrics listener.
const metricsServerTimeout = 30 * time.Second

// ServeMetrics answers GET /metrics with g's families on ln (the
// CREDITD_METRICS_ADDR listener; every other path is 404) until the
// returned stop is called.
func ServeMetrics(ln net.Listener, g prometheus.Gatherer, log zerolog.Logger) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: metricsServerTimeout, ReadTimeout: metricsServerTimeout, WriteTimeout: metricsServerTimeout}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics listener stopped")
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}
