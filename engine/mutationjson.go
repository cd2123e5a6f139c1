package engine

import (
	"encoding/json"
	"errors"
	"unsafe"

	"github.com/google/uuid"
)

// Every money operation's Mutation is decoded twice in creditd: from the
// script's reply on the request path and from the outbox by the persister.
// With encoding/json (reflection, a validation pass, then a decoding pass)
// that was 15 % of creditd's CPU in the consume bench. DecodeMutation reads
// the JSON the scripts write in one pass, by hand, and gives the exact
// result encoding/json gives: anything it does not expect (a member name in
// another case, an unknown member, a string escape, a non-ASCII byte, a
// fraction or exponent, a null where encoding/json would keep the value)
// hands the whole document to encoding/json instead, so the fast path only
// ever accepts documents it reads exactly as encoding/json does
// (TestDecodeMutationMatchesEncodingJSON holds the two to each other).

// errSlowPath asks for encoding/json.
var errSlowPath = errors.New("engine: mutation JSON outside the fast path")

// DecodeMutation decodes data into m as json.Unmarshal(data, m) would, m
// being a zero Mutation.
func DecodeMutation(data []byte, m *Mutation) error {
	d := mutationDecoder{b: data}
	if err := d.mutation(m); err == nil {
		d.ws()
		if d.i == len(d.b) {
			return nil
		}
	}
	*m = Mutation{}
	return json.Unmarshal(data, m)
}

// DecodeMutationString is DecodeMutation of the text s, read where it
// lies: the outbox entry and the script's reply come from Redis as
// strings, and converting one to []byte copied the whole document for
// each decode. Neither decoder writes to its input or keeps any part of it
// (every string is copied out, json.RawMessage is copied), so the bytes of
// the immutable string are safe to read as a slice.
func DecodeMutationString(s string, m *Mutation) error {
	return DecodeMutation(unsafe.Slice(unsafe.StringData(s), len(s)), m)
}

// Each decoder below fills a zero value member by member; a member name
// not spelled as the struct tag is the slow path's (encoding/json would
// match it case-insensitively or ignore it).

func (d *mutationDecoder) mutation(m *Mutation) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "op":
			m.OpID, err = d.uuid()
		case "kind":
			var s string
			s, err = d.word()
			m.Kind = MutationKind(s)
		case "tenant":
			m.TenantID, err = d.uuid()
		case "customer":
			m.CustomerID, err = d.uuid()
		case "env":
			var s string
			s, err = d.word()
			m.Environment = Environment(s)
		case "idem":
			m.IdempotencyKey, err = d.str()
		case "rh":
			m.RequestHash, err = d.str()
		case "at":
			m.AtMS, err = d.int()
		case "account":
			err = d.account(&m.Account)
		case "entries":
			if d.null() {
				return errSlowPath
			}
			m.Entries = []MutationEntry{}
			err = d.array(func() error {
				var e MutationEntry
				if err := d.entry(&e); err != nil {
					return err
				}
				m.Entries = append(m.Entries, e)
				return nil
			})
		case "blocks":
			if d.null() {
				return errSlowPath
			}
			m.Blocks = []MutationBlock{}
			err = d.array(func() error {
				var b MutationBlock
				if err := d.block(&b); err != nil {
					return err
				}
				m.Blocks = append(m.Blocks, b)
				return nil
			})
		case "ctx":
			if d.null() {
				m.Context = nil
				return nil
			}
			if m.Context == nil {
				m.Context = &MutationContext{}
			}
			err = d.context(m.Context)
		case "eb":
			m.EffectiveBefore, err = d.intPtr()
		case "usage":
			if d.null() {
				m.Usage = nil
				return nil
			}
			if m.Usage == nil {
				m.Usage = &MutationUsage{}
			}
			err = d.usage(m.Usage)
		case "res":
			// Every reservation call decodes one (reply and outbox):
			// encoding/json for it was 7.5 % of creditd's CPU in the
			// reserve + commit bench.
			if d.null() {
				m.Reservation = nil
				return nil
			}
			if m.Reservation == nil {
				m.Reservation = &MutationReservation{}
			}
			err = d.reservation(m.Reservation)
		case "gauge":
			if d.null() {
				m.Gauge = nil
				return nil
			}
			if m.Gauge == nil {
				m.Gauge = &MutationGauge{}
			}
			err = d.gauge(m.Gauge)
		case "budget":
			// Rarer: encoding/json for it alone.
			var r json.RawMessage
			if r, err = d.raw(); err != nil {
				return err
			}
			if m.Budget == nil {
				m.Budget = &MutationBudget{}
			}
			if json.Unmarshal(r, m.Budget) != nil {
				return errSlowPath
			}
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) account(a *MutationAccount) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "id":
			a.ID, err = d.accountID()
		case "version":
			a.Version, err = d.int()
		case "balance":
			a.Balance, err = d.int()
		case "reserved":
			a.Reserved, err = d.int()
		case "pending":
			a.Pending, err = d.int()
		case "lifetime_earned":
			a.LifetimeEarned, err = d.int()
		case "debt":
			a.Debt, err = d.int()
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) entry(e *MutationEntry) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "role":
			var s string
			s, err = d.word()
			e.Role = EntryRole(s)
		case "delta":
			e.Delta, err = d.int()
		case "type":
			var s string
			s, err = d.word()
			e.Type = EntryType(s)
		case "source":
			if d.null() {
				e.Source = nil
				return nil
			}
			var s string
			s, err = d.word()
			src := Source(s)
			e.Source = &src
		case "block":
			if d.null() {
				e.BlockID = nil
				return nil
			}
			var u uuid.UUID
			u, err = d.storedID()
			e.BlockID = &u
		case "metric":
			if d.null() {
				e.Metric = nil
				return nil
			}
			var s string
			s, err = d.metricName()
			e.Metric = &s
		case "units":
			e.Units, err = d.intPtr()
		case "rate":
			e.Rate, err = d.intPtr()
		case "ref":
			e.Ref, err = d.uuidPtr()
		case "overage":
			e.Overage, err = d.intPtr()
		case "reason":
			e.Reason, err = d.strPtr()
		case "meta":
			e.Metadata, err = d.raw()
		case "draws":
			if d.null() {
				return errSlowPath
			}
			e.Draws = []EntryDraw{}
			err = d.array(func() error {
				var w EntryDraw
				err := d.object(func(name []byte) (err error) {
					switch string(name) {
					case "b":
						w.BlockID, err = d.storedID()
					case "d":
						w.Amount, err = d.int()
					default:
						return errSlowPath
					}
					return err
				})
				e.Draws = append(e.Draws, w)
				return err
			})
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) block(b *MutationBlock) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "id":
			b.ID, err = d.storedID()
		case "original":
			b.Original, err = d.int()
		case "remaining":
			b.Remaining, err = d.int()
		case "priority":
			var n int64
			n, err = d.int()
			if n != int64(int(n)) {
				return errSlowPath
			}
			b.Priority = int(n)
		case "source":
			var s string
			s, err = d.word()
			b.Source = Source(s)
		case "starts":
			b.StartsMS, err = d.int()
		case "expires":
			b.ExpiresMS, err = d.intPtr()
		case "created":
			b.CreatedMS, err = d.int()
		case "meta":
			b.Metadata, err = d.raw()
		case "scope":
			// As encoding/json: null leaves nil, [] an empty list.
			if d.null() {
				b.Scope = nil
				return nil
			}
			b.Scope = []string{}
			err = d.array(func() error {
				k, err := d.str()
				b.Scope = append(b.Scope, k)
				return err
			})
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) context(c *MutationContext) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "ext":
			c.ExternalID, err = d.str()
		case "th":
			c.ThresholdMC, err = d.int()
		case "policy":
			var s string
			s, err = d.word()
			c.Policy = OveragePolicy(s)
		case "lim":
			c.LimitMC, err = d.int()
		case "bud":
			c.BudgetArg, err = d.str()
		case "emitter":
			c.Emitter, err = d.str()
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) usage(u *MutationUsage) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "metric":
			u.Metric, err = d.metricName()
		case "units":
			u.Units, err = d.int()
		case "cost":
			u.Cost, err = d.int()
		case "charged":
			u.Charged, err = d.int()
		case "overage":
			u.Overage, err = d.int()
		case "pool":
			u.Pool, err = d.int()
		case "refused":
			switch {
			case d.literal("true") == nil:
				u.Refused = true
			case d.literal("false") == nil:
				u.Refused = false
			default:
				return errSlowPath
			}
		case "reservation":
			u.ReservationID, err = d.uuidPtr()
		case "items":
			err = d.array(func() error {
				var it UsageItem
				if err := d.usageItem(&it); err != nil {
					return err
				}
				u.Items = append(u.Items, it)
				return nil
			})
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) reservation(r *MutationReservation) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "id":
			r.ID, err = d.uuid()
		case "metric":
			r.Metric, err = d.str()
		case "est_units":
			r.EstimatedUnits, err = d.int()
		case "est_cost":
			r.EstimatedCost, err = d.int()
		case "act_units":
			r.ActualUnits, err = d.intPtr()
		case "act_cost":
			r.ActualCost, err = d.intPtr()
		case "released":
			r.Released, err = d.int()
		case "status":
			var s string
			s, err = d.word()
			r.Status = ReservationStatus(s)
		case "expires":
			r.ExpiresMS, err = d.int()
		case "created":
			r.CreatedMS, err = d.int()
		case "committed":
			r.CommittedMS, err = d.intPtr()
		case "released_at":
			r.ReleasedMS, err = d.intPtr()
		case "meta":
			r.Metadata, err = d.raw()
		case "items":
			// encoding/json decodes a repeated array into the elements
			// already there; that is the slow path's.
			if r.Items != nil {
				return errSlowPath
			}
			if d.null() {
				return nil
			}
			r.Items = []ReservationItem{}
			err = d.array(func() error {
				var it ReservationItem
				if err := d.reservationItem(&it); err != nil {
					return err
				}
				r.Items = append(r.Items, it)
				return nil
			})
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) reservationItem(it *ReservationItem) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "billable_metric_key":
			it.BillableMetricKey, err = d.metricName()
		case "estimated_units":
			it.EstimatedUnits, err = d.int()
		case "estimated_cost":
			it.EstimatedCost, err = d.int()
		case "actual_units":
			it.ActualUnits, err = d.intPtr()
		case "actual_cost":
			it.ActualCost, err = d.intPtr()
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) gauge(g *MutationGauge) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "metric":
			g.Metric, err = d.metricName()
		case "current":
			g.Current, err = d.int()
		case "cap":
			g.Cap, err = d.intPtr()
		case "leases":
			// Rarer (leased gauges only): encoding/json for them alone,
			// into a slice it has not filled before.
			if g.Leases != nil {
				return errSlowPath
			}
			var r json.RawMessage
			if r, err = d.raw(); err != nil {
				return err
			}
			if json.Unmarshal(r, &g.Leases) != nil {
				return errSlowPath
			}
		default:
			return errSlowPath
		}
		return err
	})
}

func (d *mutationDecoder) usageItem(it *UsageItem) error {
	return d.object(func(name []byte) (err error) {
		switch string(name) {
		case "billable_metric_key":
			it.Metric, err = d.metricName()
		case "units":
			it.Units, err = d.int()
		case "cost":
			it.Cost, err = d.int()
		default:
			return errSlowPath
		}
		return err
	})
}

// MutationFastPath reports whether DecodeMutation reads data without
// encoding/json: a test holds every script's Mutation to it, so the fast
// path cannot quietly become the slow one.
func MutationFastPath(data []byte) bool {
	var m Mutation
	d := mutationDecoder{b: data}
	if d.mutation(&m) != nil {
		return false
	}
	d.ws()
	return d.i == len(d.b)
}
