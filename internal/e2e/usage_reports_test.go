package e2e

import (
	"net/url"
	"testing"
	"time"
)

// usageCharge is one consumption a usage report must show.
type usageCharge struct {
	customer, metric string
	at               time.Time
	units, cost      int64
}

// usageBucketT is a report bucket as the test expects it.
type usageBucketT struct {
	start              time.Time
	units, cost, count int64
}

// bucketStart is the start of at's UTC bucket of granularity g.
func bucketStart(g string, at time.Time) time.Time {
	at = at.UTC()
	switch g {
	case "hour":
		return at.Truncate(time.Hour)
	case "day":
		return time.Date(at.Year(), at.Month(), at.Day(), 0, 0, 0, 0, time.UTC)
	}
	return time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// expectUsage sums charges (of customer, or all when "") into g's buckets
// per metric, oldest first.
func expectUsage(charges []usageCharge, customer, g string) map[string][]usageBucketT {
	out := map[string][]usageBucketT{}
	for _, c := range charges {
		if customer != "" && c.customer != customer {
			continue
		}
		start := bucketStart(g, c.at)
		bs := out[c.metric]
		i := 0
		for i < len(bs) && bs[i].start.Before(start) {
			i++
		}
		if i == len(bs) || !bs[i].start.Equal(start) {
			bs = append(bs[:i], append([]usageBucketT{{start: start}}, bs[i:]...)...)
		}
		bs[i].units += c.units
		bs[i].cost += c.cost
		bs[i].count++
		out[c.metric] = bs
	}
	return out
}

// checkUsageReport compares a usage report's data with want, metric by
// metric, with each series' totals and bucket ends.
func checkUsageReport(t *testing.T, r Response, what, g string, want map[string][]usageBucketT) {
	t.Helper()
	if !checkStatus(t, r, 200, what) {
		return
	}
	if r.Body["granularity"] != g {
		t.Errorf("%s: granularity %v, want %s", what, r.Body["granularity"], g)
	}
	data := arr(t, r.Body["data"], what+" data")
	if len(data) != len(want) {
		t.Errorf("%s: %d metrics, want %d: %s", what, len(data), len(want), r.Raw)
		return
	}
	prev := ""
	for _, d := range data {
		s := obj(t, d, what+" series")
		key := str(t, s["billable_metric_key"], what+" metric")
		if key <= prev {
			t.Errorf("%s: metrics not sorted: %s after %s", what, key, prev)
		}
		prev = key
		wb, ok := want[key]
		buckets := arr(t, s["buckets"], what+" buckets")
		if !ok || len(buckets) != len(wb) {
			t.Errorf("%s: metric %s buckets %v, want %v", what, key, buckets, wb)
			continue
		}
		var units, cost, count int64
		for i, b := range buckets {
			bo := obj(t, b, what+" bucket")
			start, end := checkTime(t, bo["start"], what+" start"), checkTime(t, bo["end"], what+" end")
			w := wb[i]
			if !start.Equal(w.start) || !end.Equal(nextBucket(g, w.start)) || Int(t, bo["units"]) != w.units ||
				Int(t, bo["cost"]) != w.cost || Int(t, bo["count"]) != w.count {
				t.Errorf("%s: %s bucket %d %v, want %+v", what, key, i, bo, w)
			}
			units, cost, count = units+w.units, cost+w.cost, count+w.count
		}
		if Int(t, s["units"]) != units || Int(t, s["cost"]) != cost || Int(t, s["count"]) != count {
			t.Errorf("%s: %s totals %v, want %d %d %d", what, key, s, units, cost, count)
		}
	}
}

// nextBucket is the start of the bucket after start.
func nextBucket(g string, start time.Time) time.Time {
	switch g {
	case "hour":
		return start.Add(time.Hour)
	case "day":
		return start.AddDate(0, 0, 1)
	}
	return start.AddDate(0, 1, 0)
}

// usageQuery is a report's query string.
func usageQuery(g string, from, to time.Time, metric string) string {
	v := url.Values{"from": {from.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
	if g != "" {
		v.Set("granularity", g)
	}
	if metric != "" {
		v.Set("billable_metric_key", metric)
	}
	return "?" + v.Encode()
}

// TestUsageReports: the usage analytics (issue 15 item 5) over HTTP. A
// customer's single and multi-metric consumes, a usage event and a
// reservation commit, across an hour and a day boundary, show in the
// customer report at each granularity (units, priced cost and count per
// bucket, totals per metric), filtered by metric, and summed over
// customers in the tenant-wide report, which the other environment does
// not see; a refused consume and a zero-unit commit count nothing; bad
// queries are 400 naming the field; an unknown customer is 404.
func TestUsageReports(t *testing.T) {
	t.Parallel()
	// Yesterday 23:30 UTC, then today 00:30: two hours, two days.
	today := time.Now().UTC().Truncate(24 * time.Hour)
	t1 := today.Add(-30 * time.Minute)
	t2 := today.Add(30 * time.Minute)
	clock := newTestClock(t1)
	s := NewStack(t, WithClock(clock))
	tn := s.NewTenant(uniq("usage"))
	a := s.as(t, tn.Live)
	m1, m2 := a.perUnit(100), a.perUnit(7)
	one, oneExt := a.newCustomer()
	two, _ := a.newCustomer()
	broke, _ := a.newCustomer()
	a.grant(one, map[string]any{"credits": 100_000})
	a.grant(two, map[string]any{"credits": 100_000})

	consume := func(body map[string]any, what string) {
		t.Helper()
		wantStatus(t, a.post("/v1/entitlements/consume", body), 200, what)
	}
	consume(map[string]any{"customer_id": one, "billable_metric_key": m1, "units": 3}, "single consume")
	consume(map[string]any{"customer_id": oneExt, "items": items(m1, 2, m2, 10)}, "multi consume")
	r := a.post("/v1/usage", map[string]any{"events": []any{map[string]any{"event_id": uniq("evt"), "customer_id": one,
		"billable_metric_key": m2, "units": 5}}})
	if checkStatus(t, r, 200, "usage event") {
		if res := obj(t, arr(t, r.Body["results"], "results")[0], "result"); res["status"] != "charged" {
			t.Errorf("usage event: %s", r.Raw)
		}
	}
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": broke, "billable_metric_key": m1, "units": 1}),
		409, "insufficient-credits", "", "refused consume")

	clock.Advance(time.Hour)
	consume(map[string]any{"customer_id": one, "billable_metric_key": m1, "units": 1}, "consume next hour")
	reservation := a.reserve(map[string]any{"customer_id": one, "billable_metric_key": m1, "estimated_units": 4})
	wantStatus(t, a.post("/v1/reservations/"+reservation["id"].(string)+"/commit", map[string]any{"actual_units": 2}), 200, "commit")
	empty := a.reserve(map[string]any{"customer_id": one, "billable_metric_key": m1, "estimated_units": 1})
	wantStatus(t, a.post("/v1/reservations/"+empty["id"].(string)+"/commit", map[string]any{"actual_units": 0}), 200, "zero commit")
	consume(map[string]any{"customer_id": two, "billable_metric_key": m1, "units": 4}, "other customer")

	charges := []usageCharge{
		{one, m1, t1, 3, 300}, {one, m1, t1, 2, 200}, {one, m2, t1, 10, 70}, {one, m2, t1, 5, 35},
		{one, m1, t2, 1, 100}, {one, m1, t2, 2, 200},
		{two, m1, t2, 4, 400},
	}
	from, to := today.Add(-24*time.Hour), today.Add(24*time.Hour)
	months := [2]time.Time{bucketStart("month", from), bucketStart("month", to).AddDate(0, 1, 0)}
	for _, g := range []string{"hour", "day", "month"} {
		f, e := from, to
		if g == "month" {
			f, e = months[0], months[1]
		}
		checkUsageReport(t, a.get("/v1/customers/"+one+"/usage"+usageQuery(g, f, e, "")), "customer "+g, g, expectUsage(charges, one, g))
		want := expectUsage(charges, one, g)
		delete(want, m2)
		checkUsageReport(t, a.get("/v1/customers/"+oneExt+"/usage"+usageQuery(g, f, e, m1)), "customer "+g+" by external id, one metric", g, want)
	}
	r = a.get("/v1/customers/" + one + "/usage" + usageQuery("", from, to, ""))
	checkUsageReport(t, r, "default granularity", "day", expectUsage(charges, one, "day"))
	if r.Body["customer_id"] != one {
		t.Errorf("customer report customer_id %v, want %s", r.Body["customer_id"], one)
	}
	// The window cuts at its bounds: only today's hours.
	checkUsageReport(t, a.get("/v1/customers/"+one+"/usage"+usageQuery("hour", today, to, "")), "today only", "hour",
		expectUsage(charges[4:6], one, "hour"))
	checkUsageReport(t, a.get("/v1/customers/"+broke+"/usage"+usageQuery("day", from, to, "")), "refused only", "day", nil)

	s.Drain()
	for _, g := range []string{"hour", "day"} {
		r := a.get("/v1/usage" + usageQuery(g, from, to, ""))
		checkUsageReport(t, r, "tenant "+g, g, expectUsage(charges, "", g))
		if checkStatus(t, r, 200, "tenant") && r.Body["customer_id"] != nil {
			t.Errorf("tenant report customer_id %v, want null", r.Body["customer_id"])
		}
	}
	want := expectUsage(charges, "", "month")
	delete(want, m1)
	checkUsageReport(t, a.get("/v1/usage"+usageQuery("month", months[0], months[1], m2)), "tenant month, one metric", "month", want)
	checkUsageReport(t, s.as(t, tn.Sandbox).get("/v1/usage"+usageQuery("day", from, to, "")), "sandbox", "day", nil)

	day := func(d int) string { return today.AddDate(0, 0, d).Format(time.RFC3339) }
	for _, tc := range []struct {
		name, path string
		status     int
		field      string
	}{
		{"missing from", "/v1/usage?to=" + day(1), 400, "from"},
		{"missing to", "/v1/customers/" + one + "/usage?from=" + day(0), 400, "to"},
		{"bad from", "/v1/usage?from=yesterday&to=" + day(1), 400, "from"},
		{"to before from", "/v1/usage?from=" + day(1) + "&to=" + day(0), 400, "to"},
		{"bad granularity", "/v1/usage?granularity=week&from=" + day(0) + "&to=" + day(1), 400, "granularity"},
		{"from off the day", "/v1/customers/" + one + "/usage?from=" + today.Add(time.Hour).Format(time.RFC3339) + "&to=" + day(1), 400, "from"},
		{"745 hours", "/v1/usage?granularity=hour&from=" + day(0) + "&to=" + today.Add(745*time.Hour).Format(time.RFC3339), 400, "to"},
		{"367 days", "/v1/usage?from=" + day(0) + "&to=" + day(367), 400, "to"},
		{"bad metric key", "/v1/usage?billable_metric_key=a%20b&from=" + day(0) + "&to=" + day(1), 400, "billable_metric_key"},
	} {
		checkProblem(t, a.get(tc.path), tc.status, "bad-request", tc.field, tc.name)
	}
	checkProblem(t, a.get("/v1/customers/"+uniq("nobody")+"/usage"+usageQuery("day", from, to, "")), 404, "not-found", "", "unknown customer")
	checkProblem(t, s.as(t, tn.Sandbox).get("/v1/customers/"+one+"/usage"+usageQuery("day", from, to, "")), 404, "not-found", "", "other environment")
}
