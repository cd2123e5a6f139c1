package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
)

const adminUsage = `usage: creditd admin COMMAND
  tenant create NAME                    create a tenant with a live and a sandbox key
  tenant get TENANT_ID                  show a tenant and its configuration
  key create TENANT_ID live|sandbox     issue an API key (shown once)
  key revoke TENANT_ID KEY_ID           revoke an API key
  webhook set TENANT_ID URL             set the webhook URL (creates the whsec_ secret)
  webhook rotate TENANT_ID              rotate the signing secret
  webhook delete TENANT_ID              remove URL and secret
  rate-limit TENANT_ID PER_SECOND BURST set the per-key token bucket`

// admin runs the operator API's operations straight on the database, for a
// terminal user; a running creditd sees a revoked key within its 2 s cache.
func admin(args []string) error {
	if len(args) < 2 {
		fmt.Println(adminUsage)
		return nil
	}
	cfg := loadConfig()
	ctx := context.Background()
	pool, err := connectPostgres(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	tenants := engine.NewTenants(persist.NewStore(pool), engine.SystemClock{}, cfg.AllowPrivate)
	id := func(i int) (uuid.UUID, error) {
		if len(args) <= i {
			return uuid.Nil, fmt.Errorf("missing argument\n%s", adminUsage)
		}
		return uuid.Parse(args[i])
	}
	var out any
	switch args[0] + " " + args[1] {
	case "tenant create":
		if len(args) < 3 {
			return fmt.Errorf("missing NAME\n%s", adminUsage)
		}
		out, err = tenants.Create(ctx, args[2])
	case "tenant get":
		var t uuid.UUID
		if t, err = id(2); err == nil {
			var tn engine.Tenant
			if tn, err = tenants.Get(ctx, t); err == nil {
				out = engine.ConfigOf(tn)
			}
		}
	case "key create":
		var t uuid.UUID
		if t, err = id(2); err == nil && len(args) > 3 {
			out, err = tenants.CreateKey(ctx, t, engine.Environment(args[3]))
		} else if err == nil {
			err = fmt.Errorf("missing environment\n%s", adminUsage)
		}
	case "key revoke":
		var t, k uuid.UUID
		if t, err = id(2); err == nil {
			if k, err = id(3); err == nil {
				err = tenants.RevokeKey(ctx, t, k)
				out = map[string]string{"revoked": k.String()}
			}
		}
	case "webhook set":
		var t uuid.UUID
		if t, err = id(2); err == nil && len(args) > 3 {
			out, err = tenants.SetWebhook(ctx, t, args[3])
		} else if err == nil {
			err = fmt.Errorf("missing URL\n%s", adminUsage)
		}
	case "webhook rotate":
		var t uuid.UUID
		if t, err = id(2); err == nil {
			out, err = tenants.RotateSecret(ctx, t)
		}
	case "webhook delete":
		var t uuid.UUID
		if t, err = id(2); err == nil {
			err = tenants.DeleteWebhook(ctx, t)
			out = map[string]string{"deleted": "webhook"}
		}
	case "rate-limit " + args[1]:
		var t uuid.UUID
		if t, err = id(1); err == nil && len(args) > 3 {
			var ps, b int
			if ps, err = strconv.Atoi(args[2]); err == nil {
				if b, err = strconv.Atoi(args[3]); err == nil {
					out, err = tenants.SetRateLimit(ctx, t, engine.RateLimitInput{PerSecond: &ps, Burst: &b})
				}
			}
		} else if err == nil {
			err = fmt.Errorf("missing PER_SECOND BURST\n%s", adminUsage)
		}
	default:
		return fmt.Errorf("unknown admin command\n%s", adminUsage)
	}
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
