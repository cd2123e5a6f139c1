package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// countingCatalog is a Catalog of one tenant's metrics and rules that
// counts the look-ups reaching it.
type countingCatalog struct {
	Catalog
	metrics map[string]BillableMetric
	rules   map[string]MeteringRule
	fail    error
	reads   int
}

func (c *countingCatalog) GetMetric(_ context.Context, _ Scope, key string) (BillableMetric, error) {
	c.reads++
	if c.fail != nil {
		return BillableMetric{}, c.fail
	}
	m, ok := c.metrics[key]
	if !ok {
		return BillableMetric{}, ErrNotFound
	}
	return m, nil
}

func (c *countingCatalog) ActiveRule(_ context.Context, _ Scope, key string) (MeteringRule, error) {
	c.reads++
	r, ok := c.rules[key]
	if !ok {
		return MeteringRule{}, ErrNotFound
	}
	return r, nil
}

func (c *countingCatalog) CreateMetric(_ context.Context, m BillableMetric) error {
	c.metrics[m.Key] = m
	return nil
}

func (c *countingCatalog) UpdateMetric(_ context.Context, m BillableMetric) error {
	c.metrics[m.Key] = m
	return nil
}

func (c *countingCatalog) CreateRule(_ context.Context, r MeteringRule, _ BillableMetric) error {
	c.rules[r.BillableMetricKey] = r
	return nil
}

// TestCachedCatalog: look-ups, found or not, are served from memory until
// a write through the decorator forgets the key; errors are not cached;
// the API key of the scope plays no part.
func TestCachedCatalog(t *testing.T) {
	ctx := context.Background()
	tenant := uuid.New()
	scope := Scope{TenantID: tenant, Environment: EnvironmentLive, KeyID: uuid.New()}
	other := Scope{TenantID: tenant, Environment: EnvironmentLive, KeyID: uuid.New()}
	api := BillableMetric{ID: uuid.New(), TenantID: tenant, Environment: EnvironmentLive, Key: "api", Name: "API"}
	tests := []struct {
		name      string
		run       func(c *CachedCatalog, store *countingCatalog) error
		wantReads int
	}{
		{"a found metric is read once", func(c *CachedCatalog, _ *countingCatalog) error {
			for i := 0; i < 3; i++ {
				if m, ok, err := c.Metric(ctx, scope, "api"); err != nil || !ok || m.Name != "API" {
					return errors.New("metric not found")
				}
			}
			_, _, err := c.Metric(ctx, other, "api")
			return err
		}, 1},
		{"a missing metric is read once", func(c *CachedCatalog, _ *countingCatalog) error {
			for i := 0; i < 3; i++ {
				if _, ok, err := c.Metric(ctx, scope, "nope"); err != nil || ok {
					return errors.New("metric found")
				}
			}
			return nil
		}, 1},
		{"an update through the decorator is seen at once", func(c *CachedCatalog, _ *countingCatalog) error {
			c.Metric(ctx, scope, "api")
			renamed := api
			renamed.Name = "Calls"
			if err := c.UpdateMetric(ctx, renamed); err != nil {
				return err
			}
			if m, _, _ := c.Metric(ctx, other, "api"); m.Name != "Calls" {
				return errors.New("stale name after the update")
			}
			return nil
		}, 2},
		{"a created rule is seen at once", func(c *CachedCatalog, _ *countingCatalog) error {
			if _, ok, _ := c.Rule(ctx, scope, "api"); ok {
				return errors.New("rule before it was created")
			}
			r := MeteringRule{ID: uuid.New(), TenantID: tenant, Environment: EnvironmentLive, BillableMetricKey: "api"}
			if err := c.CreateRule(ctx, r, api); err != nil {
				return err
			}
			if _, ok, _ := c.Rule(ctx, scope, "api"); !ok {
				return errors.New("no rule after it was created")
			}
			return nil
		}, 2},
		{"errors are not cached", func(c *CachedCatalog, store *countingCatalog) error {
			store.fail = errors.New("down")
			if _, _, err := c.Metric(ctx, scope, "api"); err == nil {
				return errors.New("no error from a failing store")
			}
			store.fail = nil
			if _, ok, err := c.Metric(ctx, scope, "api"); err != nil || !ok {
				return errors.New("the failure was cached")
			}
			return nil
		}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := &countingCatalog{metrics: map[string]BillableMetric{"api": api}, rules: map[string]MeteringRule{}}
			c := NewCachedCatalog(store)
			if err := tc.run(c, store); err != nil {
				t.Fatal(err)
			}
			if store.reads != tc.wantReads {
				t.Errorf("%d store reads, want %d", store.reads, tc.wantReads)
			}
		})
	}
}
