package console

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
)

// plansView is a page of the scope's plans with their variants.
type plansView struct {
	Plans      []engine.Plan
	NextCursor string
}

// plansPage lists the plans (retired ones too) with their variants.
func (c *Console) plansPage(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	page, err := c.cfg.Plans.ListPlans(r.Context(), p.scope, true, true, r.URL.Query().Get("cursor"), pageSize)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "plans", "Plans", plansView{Plans: page.Data, NextCursor: page.NextCursor}, 0)
}

// plansURL is the scope's plans page.
func plansURL(p *principal) string { return scopeBase(p) + "/plans" }

// createPlan creates a plan from the form (name, default flag).
func (c *Console) createPlan(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	name := strings.TrimSpace(r.PostFormValue("name"))
	isDefault := r.PostFormValue("is_default") == "on"
	in := api.CreatePlanPayload{Name: &name, IsDefault: &isDefault}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	c.onceOnly(w, r, plansURL(p), "plan", func() (string, error) {
		plan, err := c.cfg.Plans.CreatePlan(r.Context(), p.scope, cmd)
		return "Plan " + plan.Name + " created.", err
	})
}

// createVariant adds a variant (cycle, billing mode, trial) to a plan.
func (c *Console) createVariant(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	planID, err := uuid.Parse(r.PathValue("plan"))
	if err != nil {
		c.notFound(w, r)
		return
	}
	cycle, mode := r.PostFormValue("billing_cycle"), r.PostFormValue("billing_mode")
	in := api.CreateVariantPayload{BillingCycle: &cycle, BillingMode: &mode}
	if v := strings.TrimSpace(r.PostFormValue("trial_days")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			c.back(w, r, plansURL(p), flash{Message: "trial_days: a whole number is required", Error: true})
			return
		}
		in.TrialDays = &n
	}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	c.onceOnly(w, r, plansURL(p), "variant", func() (string, error) {
		_, err := c.cfg.Plans.CreateVariant(r.Context(), p.scope, planID, cmd)
		return "Variant created.", err
	})
}

// createGrant adds a credit grant to a variant.
func (c *Console) createGrant(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	planID, err1 := uuid.Parse(r.PathValue("plan"))
	variantID, err2 := uuid.Parse(r.PathValue("variant"))
	if err1 != nil || err2 != nil {
		c.notFound(w, r)
		return
	}
	amount, ok := parseCredits(r.PostFormValue("credits"))
	if !ok {
		c.back(w, r, plansURL(p), flash{Message: "credits: a positive amount with at most three decimals is required", Error: true})
		return
	}
	interval, typ := strings.TrimSpace(r.PostFormValue("grant_interval")), r.PostFormValue("grant_type")
	in := api.PlanGrantPayload{Credits: &amount, GrantInterval: &interval, GrantType: &typ}
	if keys := scopeField(r.PostFormValue("applies_to")); keys != nil {
		in.AppliesTo = &engine.AppliesTo{BillableMetricKeys: keys}
	}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	c.onceOnly(w, r, plansURL(p), "plan-grant", func() (string, error) {
		_, err := c.cfg.Plans.CreateGrant(r.Context(), p.scope, planID, variantID, cmd)
		return "Grant of " + formatCredits(amount) + " credits added.", err
	})
}

// updatePlan renames a plan, retires or reactivates it, or makes it the
// default, from the plan's edit form.
func (c *Console) updatePlan(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	planID, err := uuid.Parse(r.PathValue("plan"))
	if err != nil {
		c.notFound(w, r)
		return
	}
	name, status := strings.TrimSpace(r.PostFormValue("name")), r.PostFormValue("status")
	isDefault := r.PostFormValue("is_default") == "on"
	in := api.UpdatePlanPayload{Name: &name, Status: &status, IsDefault: &isDefault}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	plan, err := c.cfg.Plans.UpdatePlan(r.Context(), p.scope, planID, cmd)
	if err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	c.back(w, r, plansURL(p), flash{Message: "Plan " + plan.Name + " saved."})
}

// updateVariant sets a variant's status and trial days from its edit form
// (the fields PATCH .../variants/{id} may change; the rest is fixed at
// creation).
func (c *Console) updateVariant(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	planID, err1 := uuid.Parse(r.PathValue("plan"))
	variantID, err2 := uuid.Parse(r.PathValue("variant"))
	if err1 != nil || err2 != nil {
		c.notFound(w, r)
		return
	}
	status := r.PostFormValue("status")
	in := api.UpdateVariantPayload{Status: &status}
	if v := strings.TrimSpace(r.PostFormValue("trial_days")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			c.back(w, r, plansURL(p), flash{Message: "trial_days: a whole number is required", Error: true})
			return
		}
		in.TrialDays = &n
	}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	if _, err := c.cfg.Plans.UpdateVariant(r.Context(), p.scope, planID, variantID, cmd); err != nil {
		c.backErr(w, r, plansURL(p), err)
		return
	}
	c.back(w, r, plansURL(p), flash{Message: "Variant saved."})
}
