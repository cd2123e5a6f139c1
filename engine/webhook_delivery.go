package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Name is webhook delivery's key in /readyz.
func (w *Webhooks) Name() string { return "webhook_delivery" }

// Start runs the delivery pool in the background until Stop.
func (w *Webhooks) Start(ctx context.Context) error {
	return w.Go(ctx, cmpOr(w.Poll, DefaultDeliveryPoll), w.Run)
}

// Run delivers due events until ctx ends: one dispatcher claims events for
// free workers, never more than TenantInFlight per tenant, and looks again
// every Poll or as soon as a worker frees up.
func (w *Webhooks) Run(ctx context.Context) {
	workers, perTenant, poll := w.Workers, w.TenantInFlight, w.Poll
	if workers <= 0 {
		workers = DefaultDeliveryWorkers
	}
	if perTenant <= 0 {
		perTenant = DefaultTenantInFlight
	}
	if poll <= 0 {
		poll = DefaultDeliveryPoll
	}
	jobs := make(chan Claim)
	freed := make(chan uuid.UUID, workers)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range jobs {
				w.deliverInSlot(ctx, c, perTenant, poll)
				freed <- c.Event.TenantID
			}
		}()
	}
	defer func() {
		close(jobs)
		wg.Wait()
	}()

	inFlight := map[uuid.UUID]int{}
	busy := 0
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	for {
		if busy < workers {
			skip := make([]uuid.UUID, 0, len(inFlight))
			for t, n := range inFlight {
				if n > 0 {
					skip = append(skip, t)
				}
			}
			claims, err := w.store.ClaimDue(ctx, w.clock.Now(), w.lease(), workers-busy, perTenant, skip)
			if err != nil && ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("webhooks: claim due events")
			}
			w.passed(ctx, err)
			// Claims go out in random order so no tenant is always first.
			rand.Shuffle(len(claims), func(i, j int) { claims[i], claims[j] = claims[j], claims[i] })
			for _, c := range claims {
				inFlight[c.Event.TenantID]++
				busy++
				select {
				case jobs <- c:
				case <-ctx.Done():
					return
				}
			}
		} else {
			// A full pool is busy, not stalled.
			w.Pass(nil)
		}
		select {
		case <-ctx.Done():
			return
		case t := <-freed:
			w.release(inFlight, t)
			busy--
			// Collect every other worker that finished meanwhile.
			for more := true; more; {
				select {
				case t := <-freed:
					w.release(inFlight, t)
					busy--
				default:
					more = false
				}
			}
		case <-ticker.C:
		}
	}
}

// deliverInSlot delivers c once it holds one of its tenant's fleet-wide
// slots (Slots), so TenantInFlight bounds the tenant's attempts across all
// nodes. It waits for a slot, looking every poll, at most half the lease
// (so an attempt that starts in time still ends, DeliveryTimeout, and is
// recorded before the lease runs out); in
// vain, it leaves the claim to lapse (the event is claimed again later). A
// worker that waits is one the per-process cap already counts for the
// tenant, so a slow endpoint still holds at most TenantInFlight workers of
// a node. When Slots fail (Redis unreachable), it delivers at once: the
// per-process cap still reservations, and webhooks must not stop with Redis.
func (w *Webhooks) deliverInSlot(ctx context.Context, c Claim, perTenant int, poll time.Duration) {
	if w.Slots == nil {
		w.Deliver(ctx, c)
		return
	}
	tenant := c.Event.TenantID
	deadline := time.Now().Add(w.lease() / 2)
	for {
		ok, err := w.Slots.AcquireDeliverySlot(ctx, tenant, c.Lease, perTenant, DeliverySlotLease)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn().Err(err).Str("tenant_id", tenant.String()).Msg("webhooks: fleet-wide delivery slots unreachable; capping per process")
			w.Deliver(ctx, c)
			return
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(poll):
		}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := w.Slots.ReleaseDeliverySlot(rctx, tenant, c.Lease); err != nil {
			// The slot lapses after DeliverySlotLease.
			w.log.Warn().Err(err).Str("tenant_id", tenant.String()).Msg("webhooks: release delivery slot")
		}
	}()
	w.Deliver(ctx, c)
}

func (w *Webhooks) release(inFlight map[uuid.UUID]int, t uuid.UUID) {
	if inFlight[t] <= 1 {
		delete(inFlight, t)
		return
	}
	inFlight[t]--
}

// Deliver makes one attempt at a claimed event: it reads the tenant's URL and
// current secret afresh, posts the signed payload, and records the attempt
// and the event's next state.
func (w *Webhooks) Deliver(ctx context.Context, c Claim) {
	a := w.attempt(ctx, c.Event)
	if ctx.Err() != nil {
		// Shutting down mid-attempt: the attempt proves nothing about the
		// endpoint, so it is not counted; the lease lapses and the event is
		// tried again (at-least-once).
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := w.store.RecordAttempt(rctx, c, a); err != nil {
		w.log.Warn().Err(err).Str("event_id", c.Event.ID.String()).Msg("webhooks: record attempt")
	}
}

// attempt sends the event once and works out its next state.
func (w *Webhooks) attempt(ctx context.Context, e Event) Attempt {
	start := time.Now()
	var a Attempt
	t, err := w.tenants.GetTenant(ctx, e.TenantID)
	switch {
	case err != nil:
		a.Error = w.failed(e, FailureInternal, err)
	case t.WebhookURL == nil || *t.WebhookURL == "" || t.WebhookSecret == nil || *t.WebhookSecret == "":
		a.Error = ptrTo(ErrNoWebhookURL)
	default:
		ts := w.clock.Now().Unix()
		sig, serr := Sign(*t.WebhookSecret, e.ID.String(), ts, e.Payload)
		if serr != nil {
			a.Error = w.failed(e, FailureInternal, serr)
			break
		}
		headers := map[string]string{
			"Content-Type":      "application/json",
			"webhook-id":        e.ID.String(),
			"webhook-timestamp": strconv.FormatInt(ts, 10),
			"webhook-signature": sig,
		}
		res := w.sender.Send(ctx, *t.WebhookURL, headers, e.Payload)
		body := res.Body
		if len(body) > MaxStoredResponseBytes {
			body = body[:MaxStoredResponseBytes]
		}
		a.ResponseBody = strings.ToValidUTF8(string(body), "\uFFFD")
		a.ResponseBody = strings.ReplaceAll(a.ResponseBody, "\x00", "\uFFFD")
		switch {
		case res.Err != nil:
			f := res.Failure
			if f == "" {
				f = FailureOther
			}
			a.Error = w.failed(e, f, res.Err)
		default:
			code := res.StatusCode
			a.StatusCode = &code
		}
	}
	a.DurationMS = time.Since(start).Milliseconds()
	now := w.clock.Now()
	a.At = now
	a.Attempts = e.Attempts + 1
	if a.Error == nil && a.StatusCode != nil && *a.StatusCode >= 200 && *a.StatusCode < 300 {
		a.Status, a.DeliveredAt = EventDelivered, &now
		return a
	}
	if a.Error != nil {
		a.LastError = a.Error
	} else {
		a.LastError = ptrTo(fmt.Sprintf("HTTP %d", *a.StatusCode))
	}
	if a.Attempts >= MaxDeliveryAttempts {
		a.Status = EventDeadLetter
		return a
	}
	next := now.Add(RetryDelays[a.Attempts-1])
	a.Status, a.NextRetryAt = EventFailed, &next
	return a
}

// failed logs an attempt's cause for the operator and returns the category
// the tenant sees.
func (w *Webhooks) failed(e Event, f DeliveryFailure, cause error) *string {
	ev := w.log.Info()
	if f == FailureInternal {
		ev = w.log.Error()
	}
	ev.Err(cause).Str("event_id", e.ID.String()).Str("tenant_id", e.TenantID.String()).
		Str("failure", string(f)).Msg("webhooks: attempt failed")
	return ptrTo(string(f))
}

func ptrTo[T any](v T) *T { return &v }
