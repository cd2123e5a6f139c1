package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/creditd/creditd/engine"
)

// devKeys is what `make run` remembers between starts: API keys are stored
// hashed, so the plain ones exist only in this local file.
type devKeys struct {
	TenantID string `json:"tenant_id"`
	Live     string `json:"live"`
	Sandbox  string `json:"sandbox"`
}

// devTenant creates the dev tenant on first start (or when its saved keys no
// longer work) and prints its keys and a ready curl line.
func devTenant(ctx context.Context, cfg config, tenants *engine.Tenants) error {
	var keys devKeys
	if b, err := os.ReadFile(cfg.DevFile); err == nil && json.Unmarshal(b, &keys) == nil {
		if _, _, err := tenants.Authenticate(ctx, keys.Sandbox); err != nil {
			keys = devKeys{}
		}
	}
	if keys.Sandbox == "" {
		res, err := tenants.Create(ctx, "dev")
		if err != nil {
			return err
		}
		keys = devKeys{TenantID: res.Tenant.ID.String(), Live: res.APIKeys.Live, Sandbox: res.APIKeys.Sandbox}
		if err := os.MkdirAll(filepath.Dir(cfg.DevFile), 0o700); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(keys, "", "  ")
		if err := os.WriteFile(cfg.DevFile, b, 0o600); err != nil {
			return err
		}
	}
	port := cfg.Addr
	if strings.HasPrefix(port, ":") {
		port = "localhost" + port
	}
	fmt.Printf(`
creditd dev tenant %s
  sandbox key: %s
  live key:    %s
  admin token: %s

Try it:
  curl -s -X POST http://%s/v1/customers/alice/credits/grant \
    -H 'X-API-Key: %s' -H 'Idempotency-Key: first-grant' -H 'Content-Type: application/json' \
    -d '{"credits": 10000, "source": "promotional", "reason": "welcome"}'
  curl -s http://%s/v1/customers/alice/credits -H 'X-API-Key: %s'

Operator commands (creditd tenant|key|webhook ...) on this creditd:
  export CREDITD_URL=http://%s CREDITD_ADMIN_TOKEN=%s

`, keys.TenantID, keys.Sandbox, keys.Live, cfg.AdminToken, port, keys.Sandbox, port, keys.Sandbox, port, cfg.AdminToken)
	return nil
}
