package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// countingView is a PlanView that counts its loads; every customer is on
// subscription sub.
type countingView struct {
	sub     uuid.UUID
	expires time.Time
	loads   int
}

func (v *countingView) ForCustomer(context.Context, Customer) (*SubscriptionFacts, error) {
	v.loads++
	return &SubscriptionFacts{Status: "active", AllowUsage: true, subscription: v.sub, expiresAt: v.expires}, nil
}

// forgetSubs is a SubscriptionStore whose writes succeed unless fail is set.
type forgetSubs struct {
	SubscriptionStore
	customer uuid.UUID
	fail     error
}

func (s *forgetSubs) CreateSubscription(context.Context, SubscriptionRecord) error { return s.fail }

func (s *forgetSubs) UpdateSubscription(_ context.Context, _ Scope, _ uuid.UUID, change func(*SubscriptionRecord) error) (SubscriptionRecord, error) {
	r := SubscriptionRecord{Subscription: Subscription{CustomerID: s.customer}}
	if s.fail != nil {
		return SubscriptionRecord{}, s.fail
	}
	return r, change(&r)
}

func (s *forgetSubs) RunDue(ctx context.Context, _ time.Time, _ int, change func(context.Context, *SubscriptionRecord) error) (int, error) {
	r := SubscriptionRecord{Subscription: Subscription{CustomerID: s.customer}}
	if err := change(ctx, &r); err != nil {
		return 0, nil
	}
	return 1, nil
}

// forgetOverrides is an OverrideStore whose writes succeed unless fail is set.
type forgetOverrides struct {
	OverrideStore
	fail error
}

func (s *forgetOverrides) CreateOverride(context.Context, Environment, Override, time.Time) error {
	return s.fail
}

func (s *forgetOverrides) DeleteOverride(context.Context, Scope, uuid.UUID, string, time.Time) error {
	return s.fail
}

// TestCachedPlanView: facts are read once until a subscription or
// override write through a decorator of the view forgets them (a failed
// write does not), or an override in them expires.
func TestCachedPlanView(t *testing.T) {
	ctx := context.Background()
	customer := Customer{ID: uuid.New()}
	sub := uuid.New()
	down := errors.New("down")
	tests := []struct {
		name      string
		expires   time.Duration // of an override in the facts, from now (0: none)
		write     func(v *CachedPlanView) error
		wantLoads int
	}{
		{"no write: read once", 0, func(*CachedPlanView) error { return nil }, 1},
		{"subscription created", 0, func(v *CachedPlanView) error {
			return v.ForgettingSubscriptions(&forgetSubs{customer: customer.ID}).CreateSubscription(ctx, SubscriptionRecord{Subscription: Subscription{CustomerID: customer.ID}})
		}, 2},
		{"subscription create failed", 0, func(v *CachedPlanView) error {
			err := v.ForgettingSubscriptions(&forgetSubs{customer: customer.ID, fail: down}).CreateSubscription(ctx, SubscriptionRecord{Subscription: Subscription{CustomerID: customer.ID}})
			if err != down {
				return errors.New("the error was not passed on")
			}
			return nil
		}, 1},
		{"subscription updated", 0, func(v *CachedPlanView) error {
			_, err := v.ForgettingSubscriptions(&forgetSubs{customer: customer.ID}).UpdateSubscription(ctx, Scope{}, sub, func(*SubscriptionRecord) error { return nil })
			return err
		}, 2},
		{"subscription update refused", 0, func(v *CachedPlanView) error {
			_, err := v.ForgettingSubscriptions(&forgetSubs{customer: customer.ID}).UpdateSubscription(ctx, Scope{}, sub, func(*SubscriptionRecord) error { return down })
			if err != down {
				return errors.New("the error was not passed on")
			}
			return nil
		}, 1},
		{"subscription run due", 0, func(v *CachedPlanView) error {
			_, err := v.ForgettingSubscriptions(&forgetSubs{customer: customer.ID}).RunDue(ctx, time.Time{}, 1, func(context.Context, *SubscriptionRecord) error { return nil })
			return err
		}, 2},
		{"another customer's subscription updated", 0, func(v *CachedPlanView) error {
			_, err := v.ForgettingSubscriptions(&forgetSubs{customer: uuid.New()}).UpdateSubscription(ctx, Scope{}, sub, func(*SubscriptionRecord) error { return nil })
			return err
		}, 1},
		{"override created", 0, func(v *CachedPlanView) error {
			return v.ForgettingOverrides(&forgetOverrides{}).CreateOverride(ctx, EnvironmentLive, Override{SubscriptionID: sub}, time.Time{})
		}, 2},
		{"override of another subscription deleted", 0, func(v *CachedPlanView) error {
			return v.ForgettingOverrides(&forgetOverrides{}).DeleteOverride(ctx, Scope{}, uuid.New(), "api", time.Time{})
		}, 1},
		{"override delete failed", 0, func(v *CachedPlanView) error {
			if err := v.ForgettingOverrides(&forgetOverrides{fail: down}).DeleteOverride(ctx, Scope{}, sub, "api", time.Time{}); err != down {
				return errors.New("the error was not passed on")
			}
			return nil
		}, 1},
		{"an override in the facts expired", -time.Second, func(*CachedPlanView) error { return nil }, 2},
		{"an override in the facts expires later", time.Hour, func(*CachedPlanView) error { return nil }, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			inner := &countingView{sub: sub}
			if tc.expires != 0 {
				inner.expires = now.Add(tc.expires)
			}
			v := NewCachedPlanView(inner, fixedClock{now})
			if _, err := v.ForCustomer(ctx, customer); err != nil {
				t.Fatal(err)
			}
			if err := tc.write(v); err != nil {
				t.Fatal(err)
			}
			if _, err := v.ForCustomer(ctx, customer); err != nil {
				t.Fatal(err)
			}
			if inner.loads != tc.wantLoads {
				t.Errorf("%d loads, want %d", inner.loads, tc.wantLoads)
			}
		})
	}
}
