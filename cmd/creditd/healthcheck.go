package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// healthcheckCmd is `creditd healthcheck`, for Docker's HEALTHCHECK and
// compose: one GET of /healthz (or /readyz with --ready) on CREDITD_URL,
// else on the local CREDITD_ADDR; exit 0 on a 200, 1 otherwise. It needs
// no shell or curl in the image and touches neither Redis nor Postgres.
func healthcheckCmd() *cobra.Command {
	var ready bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the creditd at CREDITD_URL (else the local CREDITD_ADDR) answers /healthz (--ready: /readyz) with 200",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig()
			if err != nil {
				return err
			}
			base := cfg.URL
			if base == "" {
				base = localURL(cfg.Addr)
			}
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if err := probe(ctx, strings.TrimRight(base, "/")+path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s%s: ok\n", strings.TrimRight(base, "/"), path)
			return nil
		},
	}
	c.Flags().BoolVar(&ready, "ready", false, "ask /readyz (Redis reachable; Postgres, dead letters and persister lag only warn) instead of /healthz")
	c.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this")
	return c
}

// localURL is the URL of a creditd listening on addr on this machine: an
// unspecified host (":8080", "0.0.0.0:8080", "[::]:8080") is the loopback.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// probe GETs url and wants a 200.
func probe(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", url, res.Status)
	}
	return nil
}
