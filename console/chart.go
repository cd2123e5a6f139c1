package console

import (
	"strconv"
	"strings"
	"time"

	"github.com/creditd/creditd/engine"
)

// Chart geometry, in SVG user units (the SVG scales to its box).
const (
	chartWidth  = 600
	chartHeight = 160
	chartPad    = 4
)

// chart is a line chart ready for the template: attributes only, no
// style, so the page's CSP needs no unsafe-inline.
type chart struct {
	// Points is the polyline's points attribute ("x,y x,y ...").
	Points string
	// Area closes Points down to the axis, for the fill.
	Area       string
	Min, Max   int64
	From, To   time.Time
	Samples    int
	Width      int
	Height     int
	Empty      bool
	LastValue  int64
	FirstValue int64
}

// balanceChart draws the balance over time from the newest ledger entries
// (newest first, as History returns them) and the balance now: walking
// back, the balance before each entry is the balance after it minus its
// delta. now closes the line at the current balance.
func balanceChart(entries []engine.LedgerEntry, balance int64, now time.Time) chart {
	type point struct {
		at time.Time
		v  int64
	}
	pts := make([]point, 0, len(entries)+2)
	pts = append(pts, point{now, balance})
	v := balance
	for _, e := range entries {
		pts = append(pts, point{e.CreatedAt, v})
		v -= e.Delta
		pts = append(pts, point{e.CreatedAt, v})
	}
	// Oldest first.
	for i, j := 0, len(pts)-1; i < j; i, j = i+1, j-1 {
		pts[i], pts[j] = pts[j], pts[i]
	}
	vals := make([]float64, len(pts))
	times := make([]time.Time, len(pts))
	for i, p := range pts {
		vals[i], times[i] = float64(p.v), p.at
	}
	c := line(times, vals)
	c.Min, c.Max = int64(c.minV), int64(c.maxV)
	c.Empty = len(entries) == 0
	c.FirstValue, c.LastValue = pts[0].v, balance
	return c.chart
}

// drawn is a chart with its value range as floats.
type drawn struct {
	chart
	minV, maxV float64
}

// line scales (times[i], vals[i]), oldest first, into the chart box; the
// value axis always includes 0.
func line(times []time.Time, vals []float64) drawn {
	d := drawn{chart: chart{Width: chartWidth, Height: chartHeight, Samples: len(vals)}}
	if len(vals) == 0 {
		d.Empty = true
		return d
	}
	d.From, d.To = times[0], times[len(times)-1]
	for _, v := range vals {
		d.minV = min(d.minV, v)
		d.maxV = max(d.maxV, v)
	}
	if d.maxV == d.minV {
		// All zero: the line lies on the axis, at the bottom.
		d.maxV = d.minV + 1
	}
	span := d.maxV - d.minV
	dur := d.To.Sub(d.From)
	var b strings.Builder
	var firstX, lastX float64
	for i, v := range vals {
		x := float64(chartPad)
		if dur > 0 {
			x += float64(chartWidth-2*chartPad) * float64(times[i].Sub(d.From)) / float64(dur)
		} else if len(vals) > 1 {
			x += float64(chartWidth-2*chartPad) * float64(i) / float64(len(vals)-1)
		}
		y := chartPad + float64(chartHeight-2*chartPad)*(d.maxV-v)/span
		if i > 0 {
			b.WriteByte(' ')
		} else {
			firstX = x
		}
		lastX = x
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64))
		b.WriteByte(',')
		b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
	}
	d.Points = b.String()
	base := strconv.FormatFloat(chartPad+float64(chartHeight-2*chartPad)*d.maxV/span, 'f', 1, 64)
	d.Area = strconv.FormatFloat(firstX, 'f', 1, 64) + "," + base + " " + d.Points + " " +
		strconv.FormatFloat(lastX, 'f', 1, 64) + "," + base
	return d
}
