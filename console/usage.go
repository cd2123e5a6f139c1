package console

import (
	"sort"
	"strconv"
	"time"

	"github.com/creditd/creditd/engine"
)

// Usage chart bounds: the newest usageDays days, the usageMetrics metrics
// with the most consumption in them (the rest summed as "other").
const (
	usageDays    = 7
	usageMetrics = 4
)

// usageChart is consumption per metric per day as grouped bars.
type usageChart struct {
	Width, Height int
	Days          []usageDay
	Legend        []usageSeries
	Max           int64
	Empty         bool
}

// usageDay is one day's bars.
type usageDay struct {
	Label string
	// LabelX is the x of the day's label.
	LabelX string
	Bars   []usageBar
}

// usageBar is one rectangle; Class picks its colour in the stylesheet.
type usageBar struct {
	X, Y, W, H string
	Class      string
	Title      string
}

// usageSeries is one metric of the legend.
type usageSeries struct {
	Key, Class, Total string
}

// consumptionChart sums the consumption entries among entries (the newest
// page of the ledger) per UTC day and metric, for the last usageDays days
// up to now; amounts are the credits debited, a multi-metric entry's split
// over its items' metrics (engine.ItemShares).
func consumptionChart(entries []engine.LedgerEntry, now time.Time) usageChart {
	const w, h, pad, labelH = 600, 160, 4, 16
	c := usageChart{Width: w, Height: h + labelH}
	today := now.UTC().Truncate(24 * time.Hour)
	first := today.AddDate(0, 0, -(usageDays - 1))
	perMetric := map[string]int64{}
	perDay := map[string]map[int]int64{}
	add := func(k string, day int, mc int64) {
		if mc <= 0 {
			return
		}
		perMetric[k] += mc
		if perDay[k] == nil {
			perDay[k] = map[int]int64{}
		}
		perDay[k][day] += mc
	}
	for _, e := range entries {
		if e.Type != engine.EntryConsumption || e.Delta >= 0 {
			continue
		}
		day := int(e.CreatedAt.UTC().Truncate(24*time.Hour).Sub(first) / (24 * time.Hour))
		if day < 0 || day >= usageDays {
			continue
		}
		if e.BillableMetricKey != nil {
			add(*e.BillableMetricKey, day, -e.Delta)
			continue
		}
		// A multi-metric consume's one entry counts under each item's
		// metric, with the credits that item paid (issue 31 item 1).
		for _, it := range engine.ItemShares(e) {
			add(it.Metric, day, it.CreditsMC)
		}
	}
	if len(perMetric) == 0 {
		c.Empty = true
		return c
	}
	keys := make([]string, 0, len(perMetric))
	for k := range perMetric {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if perMetric[keys[i]] != perMetric[keys[j]] {
			return perMetric[keys[i]] > perMetric[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) > usageMetrics {
		other := map[int]int64{}
		var total int64
		for _, k := range keys[usageMetrics-1:] {
			for d, v := range perDay[k] {
				other[d] += v
			}
			total += perMetric[k]
		}
		keys = append(keys[:usageMetrics-1], "other")
		perDay["other"], perMetric["other"] = other, total
	}
	for i, k := range keys {
		c.Legend = append(c.Legend, usageSeries{Key: k, Class: "m" + strconv.Itoa(i), Total: formatCredits(perMetric[k])})
		for _, v := range perDay[k] {
			c.Max = max(c.Max, v)
		}
	}
	slot := float64(w-2*pad) / usageDays
	barW := slot * 0.8 / float64(len(keys))
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	for d := range usageDays {
		x0 := pad + slot*float64(d) + slot*0.1
		day := usageDay{Label: first.AddDate(0, 0, d).Format("Jan 2"), LabelX: f(x0 + slot*0.4)}
		for i, k := range keys {
			v := perDay[k][d]
			if v == 0 {
				continue
			}
			bh := float64(h-2*pad) * float64(v) / float64(c.Max)
			day.Bars = append(day.Bars, usageBar{
				X: f(x0 + barW*float64(i)), Y: f(float64(h-pad) - bh), W: f(barW), H: f(bh),
				Class: "m" + strconv.Itoa(i), Title: k + ": " + formatCredits(v) + " credits",
			})
		}
		c.Days = append(c.Days, day)
	}
	return c
}
