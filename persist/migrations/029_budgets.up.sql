-- 029_budgets: a customer's spend caps per period (issue 28 item 3;
-- docs/rules.md "Budgets", docs/decisions.md "Budgets").
--
-- budgets is the customer's list, as engine.Budget encodes it:
-- [{billable_metric_key, period, time_zone, limit_mc, since}, ...], at most
-- engine.MaxBudgets. Redis keeps each budget's counter in the account hash;
-- a rebuild derives it from the ledger (consumption entries from the later
-- of the period's start and since), so no counter is stored here. The
-- constant default adds the column without rewriting the table: every
-- existing customer has no budget.
ALTER TABLE customers
    ADD COLUMN budgets JSONB NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(budgets) = 'array');
