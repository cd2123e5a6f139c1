package console

import (
	"crypto/sha256"
	"encoding/hex"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
)

// customersView is a page of customers with the search.
type customersView struct {
	Query      string
	Customers  []engine.Customer
	NextCursor string
}

// customersPage lists the scope's customers newest first, matching the
// search in external id or display name (one indexed page, cursor paged).
func (c *Console) customersPage(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q != "" && r.URL.Query().Get("cursor") == "" {
		// An exact external id opens the customer at once.
		if cu, err := c.cfg.Customers.Resolve(r.Context(), p.scope, engine.CustomerRef{Value: q, Strict: true}, false); err == nil {
			http.Redirect(w, r, scopeBase(p)+"/customers/"+cu.ID.String(), http.StatusSeeOther)
			return
		}
	}
	page, err := c.cfg.Customers.List(r.Context(), p.scope, q, r.URL.Query().Get("cursor"), pageSize)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "customers", "Customers", customersView{Query: q, Customers: page.Data, NextCursor: page.NextCursor}, 0)
}

func scopeBase(p *principal) string {
	return Prefix + "/t/" + p.scope.TenantID.String() + "/" + string(p.scope.Environment)
}

// ledgerFilter is the ledger table's filters, as the history API takes them.
type ledgerFilter struct {
	Type, Source, Metric, Cursor string
	// From and To are dates (YYYY-MM-DD, UTC): entries from the start of
	// From up to the end of To.
	From, To string
}

// window is the filter's dates as the history API's from and to instants;
// ok is false for a date that does not parse.
func (f ledgerFilter) window() (from, to string, ok bool) {
	if f.From != "" {
		d, err := time.Parse(time.DateOnly, f.From)
		if err != nil {
			return "", "", false
		}
		from = d.Format(time.RFC3339)
	}
	if f.To != "" {
		d, err := time.Parse(time.DateOnly, f.To)
		if err != nil {
			return "", "", false
		}
		to = d.AddDate(0, 0, 1).Format(time.RFC3339)
	}
	return from, to, true
}

// query is the filter as a URL query (cursor excluded), for paging links.
func (f ledgerFilter) query() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "source": f.Source, "metric": f.Metric, "from": f.From, "to": f.To} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// customerView is one customer's page.
type customerView struct {
	Customer engine.Customer
	Account  engine.Account
	Ledger   []engine.LedgerEntry
	// NextHref is the next page's link: the filters plus the cursor, each
	// query-encoded here (template.URL: built only from url.Values).
	NextHref     template.URL
	Filter       ledgerFilter
	Reservations []engine.Reservation
	Chart        chart
	Usage        usageChart
	// Entitlements are the snapshot's metrics sorted by key (nil when the
	// console has no entitlement service).
	Entitlements  []engine.SnapshotEntry
	Plan          string
	Subscriptions []engine.Subscription
	// GrantKey makes the grant form idempotent: posting it twice grants once.
	GrantKey   string
	EntryTypes []engine.EntryType
	Sources    []engine.Source
	// Budgets are the customer's budgets with when their current period
	// ends.
	Budgets []budgetRow
	// ByScope is the credit by scope (docs/rules.md "Credits scoped to
	// metrics"), shown only when some block has a scope.
	ByScope []engine.ScopeBalance
}

// budgetRow is one budget on the customer page.
type budgetRow struct {
	engine.Budget
	SpentMC  int64
	ResetsAt time.Time
}

var entryTypes = []engine.EntryType{engine.EntryPlanGrant, engine.EntryTopup, engine.EntryConsumption,
	engine.EntryReservation, engine.EntryRelease, engine.EntryExpiry, engine.EntryAdjustment, engine.EntryDebtRepayment}

var sources = []engine.Source{engine.SourcePlanGrant, engine.SourceTopup, engine.SourcePromotional,
	engine.SourceCompensation, engine.SourceReferral, engine.SourceManual, engine.SourceMigration}

// customerPage shows a customer's balance, blocks, reservations, the balance
// chart and one page of the ledger. Every read is one indexed page: the
// ledger's length never changes its cost.
func (c *Console) customerPage(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	ctx := r.Context()
	ref := engine.CustomerRef{Value: r.PathValue("customer")}
	cu, err := c.cfg.Customers.Resolve(ctx, p.scope, ref, false)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	ref = engine.CustomerRef{Value: cu.ID.String()}
	acct, err := c.cfg.Credits.Account(ctx, p.scope, ref, true)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	qv := r.URL.Query()
	f := ledgerFilter{Type: qv.Get("type"), Source: qv.Get("source"), Metric: qv.Get("metric"), Cursor: qv.Get("cursor"),
		From: qv.Get("from"), To: qv.Get("to")}
	from, to, ok := f.window()
	if !ok {
		c.fail(w, r, http.StatusBadRequest, "from and to must be dates (YYYY-MM-DD).")
		return
	}
	q, err := (&api.HistoryParams{
		Type: f.Type, Source: f.Source, BillableMetricKey: f.Metric, From: from, To: to, Cursor: f.Cursor, Limit: pageSize,
	}).ToQuery()
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	ledger, err := c.cfg.Credits.History(ctx, p.scope, ref, q)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	recent, err := c.cfg.Credits.History(ctx, p.scope, ref, engine.HistoryQuery{Limit: chartEntries})
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	var reservations []engine.Reservation
	if c.cfg.Reservations != nil {
		page, err := c.cfg.Reservations.List(ctx, p.scope, ref, string(engine.ReservationActive), "", pageSize)
		if err != nil {
			c.engineError(w, r, err)
			return
		}
		reservations = page.Data
	}
	now := c.cfg.Clock.Now()
	v := customerView{
		Customer: cu, Account: acct, Ledger: ledger.Data, Filter: f, Reservations: reservations,
		Chart:    balanceChart(recent.Data, acct.Balance, now),
		Usage:    consumptionChart(recent.Data, now),
		GrantKey: randomToken(), EntryTypes: entryTypes, Sources: sources,
	}
	// The credits read brought each budget's spend (engine.Account.Budgets).
	for _, b := range cu.Budgets {
		_, end := b.Window(now)
		row := budgetRow{Budget: b, ResetsAt: end}
		for _, st := range acct.Budgets {
			if st.Field() == b.Field() {
				row.SpentMC = st.SpentMC
			}
		}
		v.Budgets = append(v.Budgets, row)
	}
	if bs := engine.ScopeBalances(acct.Blocks, now); len(bs) > 1 {
		v.ByScope = bs
	}
	if c.cfg.Entitlements != nil {
		snap, err := c.cfg.Entitlements.Snapshot(ctx, p.scope, p.tenant, ref, true)
		if err != nil {
			c.engineError(w, r, err)
			return
		}
		for _, e := range snap.Entitlements {
			v.Entitlements = append(v.Entitlements, e)
		}
		sort.Slice(v.Entitlements, func(i, j int) bool { return v.Entitlements[i].BillableMetricKey < v.Entitlements[j].BillableMetricKey })
		if snap.PlanName != nil {
			v.Plan = *snap.PlanName
		}
	}
	if c.cfg.Subscriptions != nil {
		subs, err := c.cfg.Subscriptions.List(ctx, p.scope, ref, "", pageSize)
		if err != nil {
			c.engineError(w, r, err)
			return
		}
		v.Subscriptions = subs.Data
	}
	if ledger.NextCursor != "" {
		q := f.query()
		q.Set("cursor", ledger.NextCursor)
		v.NextHref = template.URL(scopeBase(p) + "/customers/" + cu.ID.String() + "?" + q.Encode())
	}
	title := cu.ExternalID
	c.render(w, r, http.StatusOK, "customer", title, v, 0)
}

// creditLine sets the customer's credit line (credit_limit_mc) from the
// console's form, as PATCH /v1/customers/{id} would; setting the same
// value twice changes nothing more, so a double submit is harmless.
func (c *Console) creditLine(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/customers/" + url.PathEscape(r.PathValue("customer"))
	v := strings.TrimSpace(r.PostFormValue("credit_limit"))
	limit, ok := parseCredits(v)
	if !ok && strings.HasPrefix(v, "0") && strings.Trim(v, "0.") == "" && strings.Count(v, ".") <= 1 {
		// parseCredits takes positive amounts only; 0 (or 0.000) removes the line.
		limit, ok = 0, true
	}
	if !ok || limit > engine.MaxCreditLimitMC {
		c.back(w, r, to, flash{Message: "credit line: an amount of credits from 0 with at most three decimals is required", Error: true})
		return
	}
	ref := engine.CustomerRef{Value: r.PathValue("customer")}
	if _, err := c.cfg.Customers.Update(r.Context(), p.scope, ref, engine.UpdateCustomer{CreditLimitMC: &limit}); err != nil {
		c.backErr(w, r, to, err)
		return
	}
	c.back(w, r, to, flash{Message: "Credit line set to " + formatCredits(limit) + " credits."})
}

// setParent sets (or, empty, removes) the customer's parent and its draw
// limit from the console's form, as PATCH /v1/customers/{id} would;
// setting the same twice changes nothing more.
func (c *Console) setParent(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/customers/" + url.PathEscape(r.PathValue("customer"))
	in := engine.UpdateCustomer{ParentSet: true, DrawLimitSet: true}
	if v := strings.TrimSpace(r.PostFormValue("parent")); v != "" {
		in.Parent = &v
	}
	if v := strings.TrimSpace(r.PostFormValue("limit")); v != "" && in.Parent != nil {
		limit, ok := parseCredits(v)
		if !ok && strings.Trim(v, "0.") == "" {
			limit, ok = 0, true
		}
		if !ok || limit > engine.MaxBudgetLimitMC {
			c.back(w, r, to, flash{Message: "draw limit: an amount of credits from 0 with at most three decimals is required", Error: true})
			return
		}
		d := engine.DrawLimit{Period: engine.BudgetPeriod(r.PostFormValue("period")), LimitMC: limit}
		if err := engine.CheckDrawLimit("parent_draw_limit", &d); err != nil {
			c.backErr(w, r, to, err)
			return
		}
		in.ParentDrawLimit = &d
	}
	ref := engine.CustomerRef{Value: r.PathValue("customer")}
	if _, err := c.cfg.Customers.Update(r.Context(), p.scope, ref, in); err != nil {
		c.backErr(w, r, to, err)
		return
	}
	if in.Parent == nil {
		c.back(w, r, to, flash{Message: "Parent removed."})
		return
	}
	c.back(w, r, to, flash{Message: "Parent set."})
}

// setBudget adds the budget of the console's form to the customer, or
// replaces the one of the same metric and period, as a PATCH of
// /v1/customers/{id} with the whole list would; a double submit sets the
// same budget twice, which changes nothing more.
func (c *Console) setBudget(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/customers/" + url.PathEscape(r.PathValue("customer"))
	v := strings.TrimSpace(r.PostFormValue("limit"))
	limit, ok := parseCredits(v)
	if !ok && strings.Trim(v, "0.") == "" && strings.HasPrefix(v, "0") && strings.Count(v, ".") <= 1 {
		limit, ok = 0, true // parseCredits takes positive amounts only
	}
	if !ok || limit > engine.MaxBudgetLimitMC {
		c.back(w, r, to, flash{Message: "budget: a limit in credits from 0 with at most three decimals is required", Error: true})
		return
	}
	b := engine.Budget{Period: engine.BudgetPeriod(r.PostFormValue("period")),
		TimeZone: strings.TrimSpace(r.PostFormValue("time_zone")), LimitMC: limit}
	if m := strings.TrimSpace(r.PostFormValue("metric")); m != "" {
		b.BillableMetricKey = &m
	}
	c.editBudgets(w, r, to, func(list []engine.Budget) []engine.Budget {
		out := make([]engine.Budget, 0, len(list)+1)
		for _, o := range list {
			if o.Metric() != b.Metric() || o.Period != b.Period {
				out = append(out, o)
			}
		}
		return append(out, b)
	}, "Budget set.")
}

// removeBudget removes the customer's budget of the form's metric and
// period (nothing when it has none).
func (c *Console) removeBudget(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/customers/" + url.PathEscape(r.PathValue("customer"))
	metric, period := r.PostFormValue("metric"), engine.BudgetPeriod(r.PostFormValue("period"))
	c.editBudgets(w, r, to, func(list []engine.Budget) []engine.Budget {
		out := make([]engine.Budget, 0, len(list))
		for _, o := range list {
			if o.Metric() != metric || o.Period != period {
				out = append(out, o)
			}
		}
		return out
	}, "Budget removed.")
}

// editBudgets writes edit of the customer's budget list, checked as the
// API checks it, and goes back to to with done or the error.
func (c *Console) editBudgets(w http.ResponseWriter, r *http.Request, to string, edit func([]engine.Budget) []engine.Budget, done string) {
	p := principalOf(r)
	ref := engine.CustomerRef{Value: r.PathValue("customer")}
	cu, err := c.cfg.Customers.Get(r.Context(), p.scope, ref)
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	list := edit(cu.Budgets)
	if err := engine.CheckBudgets("budget", list); err != nil {
		c.backErr(w, r, to, err)
		return
	}
	if _, err := c.cfg.Customers.Update(r.Context(), p.scope, ref, engine.UpdateCustomer{Budgets: &list}); err != nil {
		c.backErr(w, r, to, err)
		return
	}
	c.back(w, r, to, flash{Message: done})
}

// grant adds a block to the customer from the console's form. The form's
// key is the idempotency key, so a double submit grants once.
func (c *Console) grant(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/customers/" + url.PathEscape(r.PathValue("customer"))
	amount, ok := parseCredits(r.PostFormValue("credits"))
	if !ok {
		c.back(w, r, to, flash{Message: "credits: a positive amount with at most three decimals is required", Error: true})
		return
	}
	src := r.PostFormValue("source")
	if src == "" {
		src = string(engine.SourceManual)
	}
	in := api.GrantPayload{Credits: &amount, Source: &src}
	if v := strings.TrimSpace(r.PostFormValue("priority")); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			c.back(w, r, to, flash{Message: "priority: a whole number from 0 to 255 is required", Error: true})
			return
		}
		in.Priority = &n
	}
	if v := strings.TrimSpace(r.PostFormValue("expires_at")); v != "" {
		// <input type="datetime-local"> sends no zone: the form says UTC.
		t, err := time.Parse("2006-01-02T15:04", v)
		if err != nil {
			c.back(w, r, to, flash{Message: "expires_at: a date and time is required", Error: true})
			return
		}
		s := t.UTC().Format(time.RFC3339)
		in.ExpiresAt = &s
	}
	if v := strings.TrimSpace(r.PostFormValue("reason")); v != "" {
		in.Reason = &v
	}
	if keys := scopeField(r.PostFormValue("applies_to")); keys != nil {
		in.AppliesTo = &engine.AppliesTo{BillableMetricKeys: keys}
	}
	key := r.PostFormValue("grant_key")
	if len(key) < 16 || len(key) > 64 {
		c.back(w, r, to, flash{Message: "The form has expired: reload the page and try again.", Error: true})
		return
	}
	sum := sha256.Sum256([]byte(strings.Join([]string{r.PathValue("customer"), r.PostFormValue("credits"), src,
		r.PostFormValue("priority"), r.PostFormValue("expires_at"), r.PostFormValue("reason"), r.PostFormValue("applies_to")}, "\x00")))
	idem := engine.Idempotency{Key: "console-grant-" + key, RequestHash: hex.EncodeToString(sum[:])}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	if _, err := c.cfg.Credits.Grant(r.Context(), p.scope, engine.CustomerRef{Value: r.PathValue("customer")}, idem, cmd); err != nil {
		c.backErr(w, r, to, err)
		return
	}
	c.back(w, r, to, flash{Message: "Granted " + formatCredits(amount) + " credits."})
}

// scopeField reads a form's applies_to: metric keys separated by commas or
// spaces, nil when empty (every metric); ToCommand checks them.
func scopeField(v string) []string {
	keys := strings.FieldsFunc(v, func(c rune) bool { return c == ',' || c == ' ' })
	if len(keys) == 0 {
		return nil
	}
	return keys
}
