package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine/idempotency"
	"github.com/creditd/creditd/engine/idempotency/idempotencytest"
)

// errUnavailable stands for engine.ErrUnavailable: the record's Redis slot
// has no master.
var errUnavailable = errors.New("fake: unavailable")

// claimsBundle is a Claims over a fake Records, for one test.
type claimsBundle struct {
	recs   *idempotencytest.Records
	claims *idempotency.Claims
	tenant uuid.UUID
}

func setup(t *testing.T) claimsBundle {
	t.Helper()
	recs := idempotencytest.New()
	c := idempotency.NewClaims(recs, zerolog.Nop(), errUnavailable)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return claimsBundle{recs: recs, claims: c, tenant: uuid.New()}
}

func (b claimsBundle) request(key string, rerun bool) idempotency.Request {
	return idempotency.Request{Tenant: b.tenant, Key: key, RequestHash: "rh", Rerun: rerun, ID: []byte("req-1")}
}

// TestClaimOutcomes: what the claim loop answers for each record it finds,
// and how many times it asks Records.
func TestClaimOutcomes(t *testing.T) {
	t.Parallel()
	stored := idempotency.Record{Done: true, Status: 201, ContentType: "application/json", Body: []byte(`{"id":"x"}`)}
	for _, tc := range []struct {
		name  string
		rerun bool
		// prepare sets up the records before the claim.
		prepare func(b claimsBundle)
		door    idempotency.Taken
		want    idempotency.Outcome
		// begins is how many Begins the claim makes (-1: more than one).
		begins int
	}{
		{name: "no record: claimed", want: idempotency.OutcomeClaimed, begins: 1},
		{name: "another fingerprint: mismatch", prepare: func(b claimsBundle) {
			b.recs.Put(b.tenant, "k", "other", stored)
		}, want: idempotency.OutcomeMismatch, begins: 1},
		{name: "another fingerprint in progress: mismatch at once", prepare: func(b claimsBundle) {
			b.recs.Put(b.tenant, "k", "other", idempotency.Record{})
		}, want: idempotency.OutcomeMismatch, begins: 1},
		{name: "rerun mark: rerun", rerun: true, prepare: func(b claimsBundle) {
			b.recs.Put(b.tenant, "k", "rh", idempotency.Record{Done: true, Rerun: true})
		}, want: idempotency.OutcomeRerun, begins: 1},
		{name: "stored answer: replay", prepare: func(b claimsBundle) {
			b.recs.Put(b.tenant, "k", "rh", stored)
		}, want: idempotency.OutcomeReplay, begins: 1},
		{name: "record unavailable on a rerun route: run unclaimed", rerun: true, prepare: func(b claimsBundle) {
			b.recs.FailBegins(fmt.Errorf("lua: idempotency begin: %w", errUnavailable))
		}, want: idempotency.OutcomeUnclaimed, begins: 1},
		{name: "record unavailable on another route: failed", prepare: func(b claimsBundle) {
			b.recs.FailBegins(fmt.Errorf("lua: idempotency begin: %w", errUnavailable))
		}, want: idempotency.OutcomeFailed, begins: 1},
		{name: "another error on a rerun route: failed", rerun: true, prepare: func(b claimsBundle) {
			b.recs.FailBegins(errors.New("lua: idempotency begin: WRONGTYPE"))
		}, want: idempotency.OutcomeFailed, begins: 1},
		{name: "the door claimed: no Begin", door: idempotency.Taken{Asked: true, At: time.Unix(1000, 0), Claimed: true},
			want: idempotency.OutcomeClaimed, begins: 0},
		{name: "the door found the stored answer: no Begin", door: idempotency.Taken{Asked: true, Record: stored},
			want: idempotency.OutcomeReplay, begins: 0},
		{name: "the door failed: failed, no Begin", door: idempotency.Taken{Asked: true, Err: errors.New("door down")},
			want: idempotency.OutcomeFailed, begins: 0},
		{name: "the door found a twin running: Begin polls until the wait ends", prepare: func(b claimsBundle) {
			b.recs.Put(b.tenant, "k", "rh", idempotency.Record{})
		}, door: idempotency.Taken{Asked: true}, want: idempotency.OutcomeBusy, begins: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.claims.SetWait(50 * time.Millisecond)
			if tc.prepare != nil {
				tc.prepare(b)
			}
			before := time.Now()
			got := b.claims.Claim(context.Background(), context.Background(), b.request("k", tc.rerun), tc.door)
			if got.Outcome != tc.want {
				t.Fatalf("outcome %d, want %d (err %v)", got.Outcome, tc.want, got.Err)
			}
			begins, _, _ := b.recs.Calls()
			if (tc.begins >= 0 && begins != tc.begins) || (tc.begins < 0 && begins < 2) {
				t.Errorf("%d Begins, want %d", begins, tc.begins)
			}
			switch got.Outcome {
			case idempotency.OutcomeClaimed:
				if tc.door.Asked && !got.At.Equal(tc.door.At) {
					t.Errorf("claimed at %s, want the door's %s", got.At, tc.door.At)
				}
				if !tc.door.Asked && (got.At.Before(before) || got.At.After(time.Now())) {
					t.Errorf("claimed at %s, not during the call", got.At)
				}
			case idempotency.OutcomeReplay:
				if got.Record.Status != 201 || got.Record.ContentType != "application/json" || string(got.Record.Body) != `{"id":"x"}` {
					t.Errorf("replayed %+v, want the stored answer", got.Record)
				}
			case idempotency.OutcomeFailed:
				if got.Err == nil {
					t.Error("failed without an error")
				}
			case idempotency.OutcomeBusy:
				if waited := time.Since(before); waited < b.claims.WaitFor() {
					t.Errorf("busy after %s, before the wait of %s ended", waited, b.claims.WaitFor())
				}
			}
		})
	}
}

// TestClaimWaitsForTwin: a duplicate arriving while the first request runs
// waits and then replays the first's answer (one effect, one answer).
func TestClaimWaitsForTwin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.request("k", false)
	first := b.claims.Claim(context.Background(), context.Background(), r, idempotency.Taken{})
	if first.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("first: outcome %d, want claimed", first.Outcome)
	}
	go func() {
		time.Sleep(30 * time.Millisecond)
		b.claims.Settle(context.Background(), r, first.At, fakeAnswer{status: 201, ct: "application/json", body: "first"}, false)
	}()
	twin := b.claims.Claim(context.Background(), context.Background(), r, idempotency.Taken{})
	if twin.Outcome != idempotency.OutcomeReplay || string(twin.Record.Body) != "first" {
		t.Fatalf("twin: outcome %d body %q, want the first's answer replayed", twin.Outcome, twin.Record.Body)
	}
}

// TestClaimStops: a waiting duplicate gives up at once when the server
// stops.
func TestClaimStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.recs.Put(b.tenant, "k", "rh", idempotency.Record{})
	stop, cancel := context.WithCancel(context.Background())
	cancel()
	before := time.Now()
	if got := b.claims.Claim(context.Background(), stop, b.request("k", false), idempotency.Taken{}); got.Outcome != idempotency.OutcomeBusy {
		t.Fatalf("outcome %d, want busy", got.Outcome)
	}
	if waited := time.Since(before); waited > idempotency.Wait/2 {
		t.Errorf("waited %s after the stop", waited)
	}
}

// fakeAnswer is an Answer.
type fakeAnswer struct {
	status   int
	ct, body string
}

func (a fakeAnswer) StatusCode() int     { return a.status }
func (a fakeAnswer) ContentType() []byte { return []byte(a.ct) }
func (a fakeAnswer) Body() []byte        { return []byte(a.body) }

// TestSettle: a claim ends by its answer: a final answer stored, a rerun
// route's 2xx as the rerun mark (written by the batch writer, or not at
// all when the script marked it), anything else released.
func TestSettle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		rerun  bool
		marked bool
		answer fakeAnswer
		// want is the record after Settle and Close; none: released.
		want idempotency.Record
		none bool
	}{
		{name: "2xx stored", answer: fakeAnswer{201, "application/json", "b"},
			want: idempotency.Record{Done: true, Status: 201, ContentType: "application/json", Body: []byte("b")}},
		{name: "4xx stored", answer: fakeAnswer{409, "application/problem+json", "p"},
			want: idempotency.Record{Done: true, Status: 409, ContentType: "application/problem+json", Body: []byte("p")}},
		{name: "4xx of a rerun route stored", rerun: true, answer: fakeAnswer{422, "application/problem+json", "p"},
			want: idempotency.Record{Done: true, Status: 422, ContentType: "application/problem+json", Body: []byte("p")}},
		{name: "2xx of a rerun route: the mark", rerun: true, answer: fakeAnswer{200, "application/json", "b"},
			want: idempotency.Record{Done: true, Rerun: true}},
		{name: "2xx of a rerun route the script marked: left as it is", rerun: true, marked: true,
			answer: fakeAnswer{200, "application/json", "b"}, want: idempotency.Record{}},
		{name: "5xx released", answer: fakeAnswer{500, "application/problem+json", "e"}, none: true},
		{name: "429 released", rerun: true, answer: fakeAnswer{429, "application/problem+json", "e"}, none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := b.request("k", tc.rerun)
			claim := b.claims.Claim(context.Background(), context.Background(), r, idempotency.Taken{})
			if claim.Outcome != idempotency.OutcomeClaimed {
				t.Fatalf("outcome %d, want claimed", claim.Outcome)
			}
			b.claims.Settle(context.Background(), r, claim.At, tc.answer, tc.marked)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			b.claims.Close(ctx) // writes the queued marks
			got, ok := b.recs.Record(b.tenant, "k")
			if tc.none {
				if ok {
					t.Fatalf("record %+v left, want it released", got)
				}
				return
			}
			if !ok || got.Done != tc.want.Done || got.Rerun != tc.want.Rerun || got.Status != tc.want.Status ||
				got.ContentType != tc.want.ContentType || string(got.Body) != string(tc.want.Body) {
				t.Fatalf("record %+v (present %v), want %+v", got, ok, tc.want)
			}
		})
	}
}

// TestReleaseRetried: a failed Abort (a failover) is tried again until the
// claim is gone, so a retry does not wait out the claim's life.
func TestReleaseRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.request("k", false)
	if got := b.claims.Claim(context.Background(), context.Background(), r, idempotency.Taken{}); got.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("outcome %d, want claimed", got.Outcome)
	}
	b.recs.FailAborts(2, errUnavailable)
	b.claims.Release(context.Background(), r)
	deadline := time.Now().Add(10 * idempotency.AbortRetry)
	for time.Now().Before(deadline) {
		if _, ok := b.recs.Record(b.tenant, "k"); !ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rec, ok := b.recs.Record(b.tenant, "k"); ok {
		t.Fatalf("claim %+v still there", rec)
	}
	if _, aborts, _ := b.recs.Calls(); aborts != 3 {
		t.Errorf("%d Aborts, want 3 (two failed)", aborts)
	}
}

// TestReran: only a 2xx rerun is a replay of the first answer.
func TestReran(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for status, want := range map[int]bool{200: true, 201: true, 404: false, 409: false, 500: false} {
		if got := b.claims.Reran(b.request("k", true), status); got != want {
			t.Errorf("Reran(%d) = %v, want %v", status, got, want)
		}
	}
}
