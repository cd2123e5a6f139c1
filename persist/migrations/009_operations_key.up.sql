-- Usage events are idempotent on their event_id forever (addendum 7): a
-- batch looks its keys up here once Redis has forgotten them.
CREATE INDEX operations_tenant_key_idx ON operations (tenant_id, idempotency_key);
