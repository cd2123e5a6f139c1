package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestBudgetWindow(t *testing.T) {
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name       string
		b          Budget
		now        string
		start, end string
	}{
		{"UTC day", Budget{Period: BudgetDay, TimeZone: "UTC"}, "2026-11-29T08:00:00Z", "2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z"},
		{"UTC month", Budget{Period: BudgetMonth, TimeZone: "UTC"}, "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"New York day before its midnight", Budget{Period: BudgetDay, TimeZone: "America/New_York"}, "2026-11-29T03:00:00Z",
			"2026-11-28T05:00:00Z", "2026-11-29T05:00:00Z"},
		// 2026-03-08: New York springs forward, a day of 23 hours.
		{"New York spring forward", Budget{Period: BudgetDay, TimeZone: "America/New_York"}, "2026-03-08T12:00:00Z",
			"2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		// 2026-11-01: it falls back, a day of 25 hours.
		{"New York fall back", Budget{Period: BudgetDay, TimeZone: "America/New_York"}, "2026-11-01T12:00:00Z",
			"2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"Kolkata month", Budget{Period: BudgetMonth, TimeZone: "Asia/Kolkata"}, "2026-11-30T20:00:00Z",
			"2026-11-30T18:30:00Z", "2026-12-31T18:30:00Z"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start, end := c.b.Window(at(c.now))
			if !start.Equal(at(c.start)) || !end.Equal(at(c.end)) {
				t.Errorf("window %v..%v, want %s..%s", start.UTC(), end.UTC(), c.start, c.end)
			}
		})
	}
}

func TestBudgetArgAndCountingFrom(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	key := "api.calls"
	bs := []Budget{
		{Period: BudgetDay, TimeZone: "UTC", LimitMC: 1000, Since: now.Add(-48 * time.Hour)},
		// Set an hour ago: it counts from then, not from the month's start.
		{BillableMetricKey: &key, Period: BudgetMonth, TimeZone: "UTC", LimitMC: 5, Since: now.Add(-time.Hour)},
	}
	// 2026-11-29T00:00Z, 2026-11-30T00:00Z; 07:00Z, 2026-12-01T00:00Z.
	want := "u:d:|1795910400000|1795996800000|1000;u:m:api.calls|1795935600000|1796083200000|5"
	if got := BudgetArg(bs, now); got != want {
		t.Errorf("BudgetArg = %q, want %q", got, want)
	}
	if BudgetArg(nil, now) != "" {
		t.Error("BudgetArg of no budgets is not empty")
	}
	for _, f := range []string{"u:d:", "u:m:api.calls"} {
		p, m := BudgetOfField(f)
		if (Budget{BillableMetricKey: nilIfEmpty(m), Period: p}).Field() != f {
			t.Errorf("BudgetOfField(%q) = %s %q does not round-trip", f, p, m)
		}
	}
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func TestCheckBudgets(t *testing.T) {
	bad := "a b"
	key := "m"
	cases := []struct {
		name  string
		in    []Budget
		field string
	}{
		{"ok, zone defaulted", []Budget{{Period: BudgetDay, LimitMC: 0}}, ""},
		{"unknown period", []Budget{{Period: "week", LimitMC: 1}}, "budgets[0].period"},
		{"bad zone", []Budget{{Period: BudgetDay, TimeZone: "Nowhere/City", LimitMC: 1}}, "budgets[0].time_zone"},
		{"Local is no IANA name", []Budget{{Period: BudgetDay, TimeZone: "Local", LimitMC: 1}}, "budgets[0].time_zone"},
		{"negative", []Budget{{Period: BudgetDay, LimitMC: -1}}, "budgets[0].limit_mc"},
		{"past the bound", []Budget{{Period: BudgetDay, LimitMC: MaxBudgetLimitMC + 1}}, "budgets[0].limit_mc"},
		{"bad metric", []Budget{{BillableMetricKey: &bad, Period: BudgetDay, LimitMC: 1}}, "budgets[0].billable_metric_key"},
		{"twice the same", []Budget{{BillableMetricKey: &key, Period: BudgetDay, LimitMC: 1},
			{BillableMetricKey: &key, Period: BudgetDay, TimeZone: "Europe/Paris", LimitMC: 2}}, "budgets[1].period"},
		{"too many", make([]Budget, MaxBudgets+1), "budgets"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckBudgets("budgets", c.in)
			if c.field == "" {
				if err != nil || c.in[0].TimeZone != "UTC" {
					t.Errorf("err %v, zone %q; want nil and UTC", err, c.in[0].TimeZone)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindValidation || e.Field != c.field {
				t.Errorf("err %v, want a validation error naming %s", err, c.field)
			}
		})
	}
}

func TestMergeBudgetsKeepsSince(t *testing.T) {
	then, now := time.Unix(1000, 0), time.Unix(2000, 0)
	prev := []Budget{{Period: BudgetDay, TimeZone: "UTC", LimitMC: 1, Since: then}}
	next := []Budget{
		{Period: BudgetDay, TimeZone: "UTC", LimitMC: 9},          // the same counter: kept
		{Period: BudgetMonth, TimeZone: "UTC", LimitMC: 9},        // new
		{Period: BudgetDay, TimeZone: "Europe/Paris", LimitMC: 9}, // another zone: new
	}
	got := mergeBudgets(prev, next, now)
	if !got[0].Since.Equal(then) || !got[1].Since.Equal(now) || !got[2].Since.Equal(now) {
		t.Errorf("since %v %v %v, want %v %v %v", got[0].Since, got[1].Since, got[2].Since, then, now, now)
	}
}

func TestBudgetDifferences(t *testing.T) {
	pg := map[string]BudgetCounter{"u:d:": {FromMS: 100, SpentMC: 50}, "u:m:k": {FromMS: 10, SpentMC: 0}}
	cases := []struct {
		name  string
		redis map[string]string
		want  int
	}{
		{"equal", map[string]string{"u:d:": "100 50", "u:m:k": "10 0 r"}, 0},
		{"reached mark alone is no difference", map[string]string{"u:d:": "100 50 r"}, 0},
		{"missing counter with spend", map[string]string{}, 1},
		{"other spend", map[string]string{"u:d:": "100 40"}, 1},
		{"an earlier period counts zero", map[string]string{"u:d:": "50 50"}, 1},
		{"a later start is not compared", map[string]string{"u:d:": "200 7"}, 0},
		{"garbage", map[string]string{"u:d:": "x"}, 1},
		{"a field of a removed budget is ignored", map[string]string{"u:d:": "100 50", "u:d:gone": "1 9"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := budgetDifferences(c.redis, pg); len(got) != c.want {
				t.Errorf("differences %+v, want %d", got, c.want)
			}
		})
	}
}

func TestEventsOfBudget(t *testing.T) {
	op := uuid.New()
	reach := BudgetReach{Field: "u:m:api", LimitMC: 10, SpentMC: 10, ResetsMS: 1798761600000}
	used := &MutationUsage{Metric: "api", Units: 1, Cost: 10, Charged: 10}
	refusedUse := &MutationUsage{Metric: "api", Units: 1, Cost: 10, Refused: true}
	before := int64(100)
	cases := []struct {
		name string
		m    Mutation
		want []EventType
	}{
		{"a consume reaching its budget", Mutation{OpID: op, Kind: MutationConsume, Usage: used,
			Account: MutationAccount{Balance: 90}, EffectiveBefore: &before,
			Entries: []MutationEntry{{Role: RoleMain, Delta: -10, Type: EntryConsumption}},
			Budget:  &MutationBudget{Reached: []BudgetReach{reach}}},
			[]EventType{EventCreditConsumed, EventCreditBudgetReached}},
		{"a budget's refusal fires no credit.exhausted", Mutation{OpID: op, Kind: MutationConsume, Usage: refusedUse,
			Budget: &MutationBudget{Reached: []BudgetReach{reach}, Refused: true}},
			[]EventType{EventCreditBudgetReached}},
		{"a refusal for credit still does", Mutation{OpID: op, Kind: MutationConsume, Usage: refusedUse},
			[]EventType{EventCreditExhausted}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evs := EventsOf(c.m)
			var got []EventType
			for _, e := range evs {
				got = append(got, e.EventType)
			}
			if len(got) != len(c.want) {
				t.Fatalf("events %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("events %v, want %v", got, c.want)
				}
			}
			for _, e := range evs {
				if e.EventType == EventCreditBudgetReached && e.ID != EventID(op, BudgetSlot(0)) {
					t.Errorf("credit.budget_reached id %s, want the budget slot's", e.ID)
				}
			}
		})
	}
}
