package console

import (
	"net/http"

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
