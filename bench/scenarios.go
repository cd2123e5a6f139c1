package main

import (
	"bytes"
	"fmt"
	"strconv"
	"sync/atomic"
)

// Metric keys the bench defines: one per kind of charge, so each ledger
// count can be matched with the acknowledgements of its own scenario.
const (
	metricConsume = "api_calls" // consume (alone and in the mixed profile)
	metricUsage   = "events"    // usage batches
	metricReserve = "tokens"    // reservation create + commit
	metricGauge   = "seats"     // gauge increments
	// metricMulti is the metric of the items a multi-metric consume adds to
	// the three above (and its prefix: metricMulti+"_2"...).
	metricMulti = "storage"
)

// multiItems is the number of items of one consume-multi op: its CPU per
// op divided by this is the CPU per item.
const multiItems = 5

// multiMetrics are the metrics of a consume-multi op, one per item.
var multiMetrics = [multiItems]string{metricConsume, metricUsage, metricReserve, metricMulti + "_1", metricMulti + "_2"}

// Customer is a seeded customer.
type Customer struct {
	Ext string // external id, what requests name
	ID  string // service uuid
}

// Acks counts what creditd acknowledged, per ledger-writing kind.
type Acks struct {
	Consumes atomic.Int64 // consume 200s
	// MultiConsumes are consume-multi 200s: each writes one consumption
	// entry with no metric (its items are in the entry's metadata).
	MultiConsumes atomic.Int64
	UsageEvents   atomic.Int64 // usage events with status "charged"
	Commits       atomic.Int64 // reservation commit 200s
	Ambiguous     atomic.Int64 // ledger-writing calls with no answer (timeout, reset)
	GaugeApplied  atomic.Int64
}

// Target is what the load path needs to reach creditd.
type Target struct {
	Base      string // http://host:port
	Key       string
	RunID     string
	Customers []Customer
	// Controlled are the customers of the consume-controlled scenario
	// (spendcontrols.go), seeded only when it runs.
	Controlled []Customer
	Acks       *Acks
}

// Scenario is one named load profile.
type Scenario struct {
	Name      string
	Hot       bool    // every op on customer 0
	RampStart float64 // first ramp rate
	Unit      string  // what one op is ("op", "call")
	op        opFunc
}

// pick spreads ops over every customer (a multiplicative hash of the
// sequence number), or names the hot one.
func (t *Target) pick(seq uint64, hot bool) *Customer {
	if hot {
		return &t.Customers[0]
	}
	return &t.Customers[(seq*0x9E3779B97F4A7C15>>20)%uint64(len(t.Customers))]
}

func (t *Target) idem(w *worker, kind string, seq uint64) []byte {
	w.buf = append(w.buf[:0], t.RunID...)
	w.buf = append(w.buf, '-')
	w.buf = append(w.buf, kind...)
	w.buf = append(w.buf, '-')
	w.buf = strconv.AppendUint(w.buf, seq, 10)
	return w.buf
}

func (t *Target) prepare(w *worker, method, path string) {
	w.req.Reset()
	w.resp.Reset()
	w.req.Header.SetMethod(method)
	w.req.SetRequestURI(t.Base + path)
	w.req.Header.Set("X-API-Key", t.Key)
}

func (t *Target) post(w *worker, path, kind string, seq uint64, body []byte) (int, error) {
	t.prepare(w, "POST", path)
	w.req.Header.SetContentType("application/json")
	w.req.Header.SetBytesV("Idempotency-Key", t.idem(w, kind, seq))
	w.req.SetBodyRaw(body)
	return w.do()
}

func (t *Target) check(hot bool) opFunc {
	return func(w *worker, seq uint64) (int, error) {
		c := t.pick(seq, hot)
		t.prepare(w, "GET", "/v1/entitlements/check?customer_id="+c.Ext+"&billable_metric_key="+metricConsume+"&units=1")
		return w.do()
	}
}

func (t *Target) consume(hot bool) opFunc {
	return func(w *worker, seq uint64) (int, error) {
		c := t.pick(seq, hot)
		body := []byte(`{"customer_id":"` + c.Ext + `","billable_metric_key":"` + metricConsume + `","units":1}`)
		st, err := t.post(w, "/v1/entitlements/consume", "c", seq, body)
		t.ack(st, err, &t.Acks.Consumes, 1)
		return st, err
	}
}

// consumeMulti is a multi-metric consume of multiItems metrics, one unit
// each: one script and one ledger entry for all of them.
func (t *Target) consumeMulti(hot bool) opFunc {
	var items bytes.Buffer
	for i, m := range multiMetrics {
		if i > 0 {
			items.WriteByte(',')
		}
		fmt.Fprintf(&items, `{"billable_metric_key":%q,"units":1}`, m)
	}
	tail := `","items":[` + items.String() + `]}`
	return func(w *worker, seq uint64) (int, error) {
		c := t.pick(seq, hot)
		body := []byte(`{"customer_id":"` + c.Ext + tail)
		st, err := t.post(w, "/v1/entitlements/consume", "cm", seq, body)
		t.ack(st, err, &t.Acks.MultiConsumes, 1)
		return st, err
	}
}

func (t *Target) gauge(hot bool) opFunc {
	body := []byte(`{"amount":1,"policy":"allow"}`)
	return func(w *worker, seq uint64) (int, error) {
		c := t.pick(seq, hot)
		st, err := t.post(w, "/v1/customers/"+c.Ext+"/entitlements/"+metricGauge+"/increment", "g", seq, body)
		if err == nil && st == 200 {
			t.Acks.GaugeApplied.Add(1)
		}
		return st, err
	}
}

var leaseField = []byte(`"lease":{"id":"`)

// gaugeLease takes one slot with a 1 s lease and renews it (issue 15:
// the hot path of a leased gauge, what a job does on start and then on
// each heartbeat). The leases lapse by themselves a second later, so a
// customer holds about rate / customers of them (a gauge holds at most
// 200: the -hot variant is refused past 200 ops/s).
func (t *Target) gaugeLease(hot bool) opFunc {
	body := []byte(`{"amount":1,"policy":"allow","lease_seconds":1}`)
	renew := []byte(`{"lease_seconds":1}`)
	return func(w *worker, seq uint64) (int, error) {
		c := t.pick(seq, hot)
		base := "/v1/customers/" + c.Ext + "/entitlements/" + metricGauge
		st, err := t.post(w, base+"/increment", "gl", seq, body)
		if err != nil || st != 200 {
			return st, err
		}
		t.Acks.GaugeApplied.Add(1)
		raw := w.resp.Body()
		i := bytes.Index(raw, leaseField)
		if i < 0 || len(raw) < i+len(leaseField)+36 {
			return 599, nil
		}
		id := string(raw[i+len(leaseField) : i+len(leaseField)+36])
		return t.post(w, base+"/leases/"+id+"/renew", "glr", seq, renew)
	}
}

var idField = []byte(`"id":"`)

func (t *Target) reserve(hot bool) opFunc {
	commit := []byte(`{"actual_units":8}`)
	return func(w *worker, seq uint64) (int, error) {
		c := t.pick(seq, hot)
		body := []byte(`{"customer_id":"` + c.Ext + `","billable_metric_key":"` + metricReserve + `","estimated_units":10,"ttl_seconds":600}`)
		st, err := t.post(w, "/v1/reservations", "r", seq, body)
		if err != nil || st != 201 {
			return st, err
		}
		raw := w.resp.Body()
		i := bytes.Index(raw, idField)
		if i < 0 || len(raw) < i+len(idField)+36 {
			return 599, nil
		}
		id := string(raw[i+len(idField) : i+len(idField)+36])
		st, err = t.post(w, "/v1/reservations/"+id+"/commit", "rc", seq, commit)
		t.ack(st, err, &t.Acks.Commits, 1)
		return st, err
	}
}

var charged = []byte(`"status":"charged"`)

// usage sends a batch of 10 events, each for another customer when spread.
func (t *Target) usage(hot bool) opFunc {
	return func(w *worker, seq uint64) (int, error) {
		var b bytes.Buffer
		b.WriteString(`{"events":[`)
		for k := 0; k < 10; k++ {
			if k > 0 {
				b.WriteByte(',')
			}
			c := t.pick(seq*10+uint64(k), hot)
			fmt.Fprintf(&b, `{"event_id":"%s-u-%d-%d","customer_id":"%s","billable_metric_key":"%s","units":1}`,
				t.RunID, seq, k, c.Ext, metricUsage)
		}
		b.WriteString(`]}`)
		st, err := t.post(w, "/v1/usage", "u", seq, b.Bytes())
		if err == nil && st == 200 {
			n := int64(bytes.Count(w.resp.Body(), charged))
			w.extra = n
			t.Acks.UsageEvents.Add(n)
		} else if err != nil {
			t.Acks.Ambiguous.Add(10)
		}
		return st, err
	}
}

// mixed is 70 % checks, 20 % consumes, 5 % gauge increments, 5 %
// reservation create + commit.
func (t *Target) mixed(hot bool) opFunc {
	check, consume, gauge, reserve := t.check(hot), t.consume(hot), t.gauge(hot), t.reserve(hot)
	return func(w *worker, seq uint64) (int, error) {
		switch r := (seq * 0xC2B2AE3D27D4EB4F >> 32) % 100; {
		case r < 70:
			return check(w, seq)
		case r < 90:
			return consume(w, seq)
		case r < 95:
			return gauge(w, seq)
		default:
			return reserve(w, seq)
		}
	}
}

func (t *Target) ack(st int, err error, n *atomic.Int64, by int64) {
	switch {
	case err == nil && st == 200:
		n.Add(by)
	case err != nil:
		t.Acks.Ambiguous.Add(by)
	}
}

// scenarios lists the profiles by name.
func (t *Target) scenarios() map[string]func(hot bool) Scenario {
	mk := func(name string, start float64, unit string, f func(bool) opFunc) func(bool) Scenario {
		return func(hot bool) Scenario {
			n := name
			if hot {
				n += "-hot"
			}
			return Scenario{Name: n, Hot: hot, RampStart: start, Unit: unit, op: f(hot)}
		}
	}
	return map[string]func(bool) Scenario{
		"check":   mk("check", 1000, "check", t.check),
		"consume": mk("consume", 500, "consume", t.consume),
		// In the default set since issue 15's "done when": the hot path of a
		// multi-metric consume (CPU per item) and of a lease renew.
		"consume-multi":    mk("consume-multi", 300, fmt.Sprintf("consume of %d items", multiItems), t.consumeMulti),
		scenarioControlled: mk(scenarioControlled, 500, "consume", t.consumeControlled),
		"gauge":            mk("gauge", 500, "increment", t.gauge),
		"gauge-lease":      mk("gauge-lease", 250, "leased increment+renew", t.gaugeLease),
		"reserve":          mk("reserve", 250, "create+commit", t.reserve),
		"usage":            mk("usage", 100, "call of 10 events", t.usage),
		"mixed":            mk("mixed", 500, "op", t.mixed),
	}
}
