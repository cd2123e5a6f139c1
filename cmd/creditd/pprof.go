package main

import (
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/rs/zerolog"
)

// servePprof serves Go's runtime profiles on addr, apart from the API: the
// bench reads a CPU profile of creditd under load from it, and an operator
// can do the same. It serves nothing else, and nothing at all unless
// CREDITD_PPROF_ADDR is set. The profiles expose internals (stacks, heap),
// so a non-loopback address is logged as a warning.
func servePprof(addr string, log zerolog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn().Str("addr", ln.Addr().String()).Msg("CREDITD_PPROF_ADDR is not a loopback address: runtime profiles are open to the network")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// A CPU profile takes as long as asked (seconds=): no write timeout.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("pprof listener stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("pprof listening")
	return func() { _ = srv.Close() }, nil
}
