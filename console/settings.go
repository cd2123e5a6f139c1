package console

import (
	"net/http"
	"strings"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
)

// settingsView is a tenant's own settings (docs/spec/addendum.md §2): the defaults it may
// change and what only the operator changes.
type settingsView struct {
	Tenant   engine.Tenant
	Policies []engine.OveragePolicy
}

// settingsPage shows the tenant's defaults, webhook URL and rate limit.
func (c *Console) settingsPage(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	c.render(w, r, http.StatusOK, "settings", "Settings", settingsView{
		Tenant:   p.tenant,
		Policies: []engine.OveragePolicy{engine.OveragePolicyBlock, engine.OveragePolicyAllow, engine.OveragePolicyNotify},
	}, 0)
}

// saveSettings changes the tenant's default overage policy and low-balance
// threshold (both environments: they are the tenant's, as PATCH /v1/tenant).
func (c *Console) saveSettings(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/settings"
	policy := r.PostFormValue("default_overage_policy")
	in := api.TenantConfigPayload{DefaultOveragePolicy: &policy}
	v := strings.TrimSpace(r.PostFormValue("default_low_balance_threshold"))
	threshold, ok := parseCredits(v)
	if v == "0" || v == "" {
		threshold, ok = 0, true
	}
	if !ok {
		c.back(w, r, to, flash{Message: "default_low_balance_threshold: an amount with at most three decimals, or 0 for off, is required", Error: true})
		return
	}
	in.DefaultLowBalanceThresholdMC = &threshold
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	if _, err := c.cfg.Tenants.UpdateConfig(r.Context(), p.scope.TenantID, cmd); err != nil {
		c.backErr(w, r, to, err)
		return
	}
	c.back(w, r, to, flash{Message: "Settings saved."})
}
