-- 026_credit_line: a customer's credit line and what its account owes on it
-- (issue 28 item 2; docs/rules.md "Credit line", docs/decisions.md
-- "Credit line").
--
-- credit_limit_mc is the line the tenant sets on the customer: under
-- policy block the effective balance may go down to minus it. debt is
-- what the account owes on the line (>= 0), written by the persister from
-- each Mutation's account section like the other figures; balance already
-- counts it (balance = the live blocks' credit - debt), so a rebuild
-- restores the debt from here and a reconcile holds the ledger sum to
-- blocks - debt. Both default to 0: every existing row is a customer
-- without a line and an account without debt, so nothing is rewritten
-- (a constant default adds a column without touching the table).
ALTER TABLE customers
    ADD COLUMN credit_limit_mc BIGINT NOT NULL DEFAULT 0 CHECK (credit_limit_mc >= 0);
ALTER TABLE credit_accounts
    ADD COLUMN debt BIGINT NOT NULL DEFAULT 0 CHECK (debt >= 0);
