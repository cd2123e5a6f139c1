// Credit alert rules: when a mutation crosses a threshold or asks for a top-up,
// and the events it then owes. Pure functions the persister calls.

package engine

import (
	"math"
	"time"

	"github.com/google/uuid"
)

// ThresholdCrossedData is the data of credit.threshold_crossed.
type ThresholdCrossedData struct {
	Threshold AlertThreshold `json:"threshold"`
	// ThresholdMC is the threshold's amount when it was crossed.
	ThresholdMC int64 `json:"threshold_mc"`
	// BalanceMC is the effective balance after the operation.
	BalanceMC int64 `json:"balance_mc"`
	// PreviousBalanceMC is the effective balance before it.
	PreviousBalanceMC int64 `json:"previous_balance_mc"`
}

// TopupRequestedData is the data of credit.topup_requested.
type TopupRequestedData struct {
	// RequestedMC is the credit the rule asks for (its amount_mc).
	RequestedMC int64 `json:"requested_mc"`
	BelowMC     int64 `json:"below_mc"`
	BalanceMC   int64 `json:"balance_mc"`
	// IdempotencyKey is the key to send with the topup that answers this
	// request, so a retried topup is applied once.
	IdempotencyKey      string `json:"idempotency_key"`
	DedupeWindowSeconds int64  `json:"dedupe_window_seconds"`
}

// AlertState is what the persister keeps per customer between batches.
type AlertState struct {
	// Version is the account version of the last Mutation evaluated (0:
	// none); an older or equal one is a replay and is skipped.
	Version int64
	// BalanceMC is the effective balance after it, when BalanceKnown.
	BalanceMC    int64
	BalanceKnown bool
	// LastGrantMC is the credits of the customer's newest grant (0: none).
	LastGrantMC int64
	// TopupRequestedAt is when credit.topup_requested last fired.
	TopupRequestedAt *time.Time
}

// AlertSubject is one customer's alert settings, facts and state, which
// EvaluateAlerts advances Mutation by Mutation.
type AlertSubject struct {
	ExternalID string
	Settings   AlertSettings
	// PeriodAllowanceMC is the base of percent_of_period_allowance (0: none).
	PeriodAllowanceMC int64
	State             AlertState
}

// ThresholdCrossed reports a downward crossing of threshold: from
// at-or-above it to below it. A threshold of 0 (unresolved) never fires; the
// same rule as credit.low_balance, so a threshold fires once on the way down
// and is armed again only once the balance is back at or above it.
func ThresholdCrossed(before, after, threshold int64) bool {
	return LowBalanceCrossed(before, after, threshold)
}

// ResolveThreshold is t's amount in millicredits: its amount_mc, or
// floor(base x percent / 100) of the last grant or the period allowance,
// computed without overflow; 0 when the base is unknown (never fires).
func ResolveThreshold(t AlertThreshold, lastGrantMC, allowanceMC int64) int64 {
	switch t.Type {
	case ThresholdAbsolute:
		if t.AmountMC != nil {
			return *t.AmountMC
		}
	case ThresholdPercentOfLastGrant:
		return percentOf(lastGrantMC, t.Percent)
	case ThresholdPercentOfPeriodAllowance:
		return percentOf(allowanceMC, t.Percent)
	}
	return 0
}

// percentOf is floor(base x p / 100) for base >= 0 and 0 <= p <= 100,
// split so no product overflows int64.
func percentOf(base int64, p *int64) int64 {
	if p == nil || base <= 0 || *p <= 0 {
		return 0
	}
	pct := min(*p, MaxAlertPercent)
	return base/100*pct + base%100*pct/100
}

// grantedMC is the credits m granted when it is a grant (its first main
// entry, positive), else 0.
func grantedMC(m *Mutation) int64 {
	if m.Kind != MutationGrant {
		return 0
	}
	i := m.firstMain()
	if i < 0 || m.Entries[i].Delta <= 0 {
		return 0
	}
	return m.Entries[i].Delta
}

// TopupIdempotencyKey is the Idempotency-Key a payment integration sends
// with the topup that answers the credit.topup_requested event id.
func TopupIdempotencyKey(event uuid.UUID) string { return "topup-request-" + event.String() }

// EvaluateAlerts advances s over m, the customer's next Mutation in stream
// order, and returns the alert events m owes. It is pure: the persister runs
// it in the transaction that stores m, and a replay (an account version not
// newer than the state's) yields nothing and leaves s as it was.
//   - the effective balance before m is what m says (EffectiveBeforeOf)
//     plus what its expiry entries took (expiredCredit), else the state's when m directly follows the last Mutation evaluated
//     (version + 1: settings added after a pause must not compare with a
//     balance from before it), else unknown (no crossing; the state starts
//     at m's balance);
//   - a grant sets the last grant before the thresholds resolve;
//   - each threshold fires credit.threshold_crossed when the balance crosses
//     its amount downwards (ThresholdCrossed);
//   - the top-up rule fires credit.topup_requested when the balance crosses
//     below_mc downwards and no request fired within its dedupe window.
func EvaluateAlerts(s *AlertSubject, m *Mutation) []Event {
	if m.Account.Version <= s.State.Version {
		return nil
	}
	after := m.EffectiveAfter()
	before, known := EffectiveBeforeOf(m)
	if known {
		before = addClamped(before, m.expiredCredit())
	}
	if !known && s.State.BalanceKnown && m.Account.Version == s.State.Version+1 {
		before, known = s.State.BalanceMC, true
	}
	if g := grantedMC(m); g > 0 {
		s.State.LastGrantMC = g
	}
	s.State.Version, s.State.BalanceMC, s.State.BalanceKnown = m.Account.Version, after, true
	if !known {
		return nil
	}
	var out []Event
	ext := s.ExternalID
	if m.Context != nil {
		ext = m.Context.ExternalID
	}
	for i, t := range s.Settings.Thresholds {
		v := ResolveThreshold(t, s.State.LastGrantMC, s.PeriodAllowanceMC)
		if ThresholdCrossed(before, after, v) {
			out = append(out, newMutationEvent(*m, ThresholdSlot(i), EventCreditThresholdCrossed, &ext,
				ThresholdCrossedData{Threshold: t, ThresholdMC: v, BalanceMC: after, PreviousBalanceMC: before}))
		}
	}
	if r := s.Settings.Topup; r != nil && ThresholdCrossed(before, after, r.BelowMC) {
		at := m.At()
		window := time.Duration(min(r.DedupeWindowSeconds, math.MaxInt64/int64(time.Second))) * time.Second
		if last := s.State.TopupRequestedAt; last == nil || !at.Before(last.Add(window)) {
			id := EventID(m.OpID, SlotTopupRequested)
			out = append(out, newMutationEvent(*m, SlotTopupRequested, EventCreditTopupRequested, &ext,
				TopupRequestedData{RequestedMC: r.AmountMC, BelowMC: r.BelowMC, BalanceMC: after,
					IdempotencyKey: TopupIdempotencyKey(id), DedupeWindowSeconds: r.DedupeWindowSeconds}))
			s.State.TopupRequestedAt = &at
		}
	}
	return out
}

// expiredCredit is the credit m's expiry entries took (positive). A script's
// effective balance before (EffectiveBefore) already leaves out the blocks
// that were due, as every balance read does; the customer's balance fell by
// this much when they expired, so the alert rules count it as part of m's
// drop (issue 24: an expiry crossing the top-up rule requests a top-up).
func (m *Mutation) expiredCredit() int64 {
	var n int64
	for _, e := range m.Entries {
		if e.Type == EntryExpiry && e.Delta < 0 {
			n = addClamped(n, -e.Delta)
		}
	}
	return n
}

// addClamped is a+b for non-negative b, at most math.MaxInt64: a balance
// is an int64, so the sum only clamps on figures no account can hold.
func addClamped(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
