package idempotency

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// claimsBundle is a Claims over a fake Records, for one test.
type claimsBundle struct {
	recs   *fakeRecords
	claims *Claims
	tenant uuid.UUID
}

func setup(t *testing.T) claimsBundle {
	t.Helper()
	recs := newFakeRecords()
	c := NewClaims(recs, zerolog.Nop(), errUnavailable)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return claimsBundle{recs: recs, claims: c, tenant: uuid.New()}
}

func (b claimsBundle) request(key string, rerun bool) Request {
	return Request{Tenant: b.tenant, Key: key, RequestHash: "rh", Rerun: rerun, ID: []byte("req-1")}
}

// TestClaimOutcomes: what the claim loop answers for each record it finds,
// and how many times it asks Records.
func TestClaimOutcomes(t *testing.T) {
	t.Parallel()
	stored := Record{Done: true, Status: 201, ContentType: "application/json", Body: []byte(`{"id":"x"}`)}
	for _, tc := range []struct {
		name  string
		rerun bool
		// prepare sets up the records before the claim.
		prepare func(b claimsBundle)
		door    Taken
		want    Outcome
		// begins is how many Begins the claim makes (-1: more than one).
		begins int
	}{
		{name: "no record: claimed", want: OutcomeClaimed, begins: 1},
		{name: "another fingerprint: mismatch", prepare: func(b claimsBundle) {
			b.recs.put(b.tenant, "k", "other", stored)
		}, want: OutcomeMismatch, begins: 1},
		{name: "another fingerprint in progress: mismatch at once", prepare: func(b claimsBundle) {
			b.recs.put(b.tenant, "k", "other", Record{})
		}, want: OutcomeMismatch, begins: 1},
		{name: "rerun mark: rerun", rerun: true, prepare: func(b claimsBundle) {
			b.recs.put(b.tenant, "k", "rh", Record{Done: true, Rerun: true})
		}, want: OutcomeRerun, begins: 1},
		{name: "stored answer: replay", prepare: func(b claimsBundle) {
			b.recs.put(b.tenant, "k", "rh", stored)
		}, want: OutcomeReplay, begins: 1},
		{name: "record unavailable on a rerun route: run unclaimed", rerun: true, prepare: func(b claimsBundle) {
			b.recs.beginFails = fmt.Errorf("lua: idempotency begin: %w", errUnavailable)
		}, want: OutcomeUnclaimed, begins: 1},
		{name: "record unavailable on another route: failed", prepare: func(b claimsBundle) {
			b.recs.beginFails = fmt.Errorf("lua: idempotency begin: %w", errUnavailable)
		}, want: OutcomeFailed, begins: 1},
		{name: "another error on a rerun route: failed", rerun: true, prepare: func(b claimsBundle) {
			b.recs.beginFails = errors.New("lua: idempotency begin: WRONGTYPE")
		}, want: OutcomeFailed, begins: 1},
		{name: "the door claimed: no Begin", door: Taken{Asked: true, At: time.Unix(1000, 0), Claimed: true},
			want: OutcomeClaimed, begins: 0},
		{name: "the door found the stored answer: no Begin", door: Taken{Asked: true, Record: stored},
			want: OutcomeReplay, begins: 0},
		{name: "the door failed: failed, no Begin", door: Taken{Asked: true, Err: errors.New("door down")},
			want: OutcomeFailed, begins: 0},
		{name: "the door found a twin running: Begin polls until the wait ends", prepare: func(b claimsBundle) {
			b.recs.put(b.tenant, "k", "rh", Record{})
		}, door: Taken{Asked: true}, want: OutcomeBusy, begins: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.claims.wait = 50 * time.Millisecond
			if tc.prepare != nil {
				tc.prepare(b)
			}
			before := time.Now()
			got := b.claims.Claim(context.Background(), context.Background(), b.request("k", tc.rerun), tc.door)
			if got.Outcome != tc.want {
				t.Fatalf("outcome %d, want %d (err %v)", got.Outcome, tc.want, got.Err)
			}
			begins, _ := b.recs.counts()
			if (tc.begins >= 0 && begins != tc.begins) || (tc.begins < 0 && begins < 2) {
				t.Errorf("%d Begins, want %d", begins, tc.begins)
			}
			switch got.Outcome {
			case OutcomeClaimed:
				if tc.door.Asked && !got.At.Equal(tc.door.At) {
					t.Errorf("claimed at %s, want the door's %s", got.At, tc.door.At)
				}
				if !tc.door.Asked && (got.At.Before(before) || got.At.After(time.Now())) {
					t.Errorf("claimed at %s, not during the call", got.At)
				}
			case OutcomeReplay:
				if got.Record.Status != 201 || got.Record.ContentType != "application/json" || string(got.Record.Body) != `{"id":"x"}` {
					t.Errorf("replayed %+v, want the stored answer", got.Record)
				}
			case OutcomeFailed:
				if got.Err == nil {
					t.Error("failed without an error")
				}
			case OutcomeBusy:
				if waited := time.Since(before); waited < b.claims.wait {
					t.Errorf("busy after %s, before the wait of %s ended", waited, b.claims.wait)
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
	first := b.claims.Claim(context.Background(), context.Background(), r, Taken{})
	if first.Outcome != OutcomeClaimed {
		t.Fatalf("first: outcome %d, want claimed", first.Outcome)
	}
	go func() {
		time.Sleep(30 * time.Millisecond)
		b.claims.Settle(context.Background(), r, first.At, fakeAnswer{status: 201, ct: "application/json", body: "first"}, false)
	}()
	twin := b.claims.Claim(context.Background(), context.Background(), r, Taken{})
	if twin.Outcome != OutcomeReplay || string(twin.Record.Body) != "first" {
		t.Fatalf("twin: outcome %d body %q, want the first's answer replayed", twin.Outcome, twin.Record.Body)
	}
}

// TestClaimStops: a waiting duplicate gives up at once when the server
// stops.
func TestClaimStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.recs.put(b.tenant, "k", "rh", Record{})
	stop, cancel := context.WithCancel(context.Background())
	cancel()
	before := time.Now()
	if got := b.claims.Claim(context.Background(), stop, b.request("k", false), Taken{}); got.Outcome != OutcomeBusy {
		t.Fatalf("outcome %d, want busy", got.Outcome)
	}
	if waited := time.Since(before); waited > Wait/2 {
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
		want Record
		none bool
	}{
		{name: "2xx stored", answer: fakeAnswer{201, "application/json", "b"},
			want: Record{Done: true, Status: 201, ContentType: "application/json", Body: []byte("b")}},
		{name: "4xx stored", answer: fakeAnswer{409, "application/problem+json", "p"},
			want: Record{Done: true, Status: 409, ContentType: "application/problem+json", Body: []byte("p")}},
		{name: "4xx of a rerun route stored", rerun: true, answer: fakeAnswer{422, "application/problem+json", "p"},
			want: Record{Done: true, Status: 422, ContentType: "application/problem+json", Body: []byte("p")}},
		{name: "2xx of a rerun route: the mark", rerun: true, answer: fakeAnswer{200, "application/json", "b"},
			want: Record{Done: true, Rerun: true}},
		{name: "2xx of a rerun route the script marked: left as it is", rerun: true, marked: true,
			answer: fakeAnswer{200, "application/json", "b"}, want: Record{}},
		{name: "5xx released", answer: fakeAnswer{500, "application/problem+json", "e"}, none: true},
		{name: "429 released", rerun: true, answer: fakeAnswer{429, "application/problem+json", "e"}, none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := b.request("k", tc.rerun)
			claim := b.claims.Claim(context.Background(), context.Background(), r, Taken{})
			if claim.Outcome != OutcomeClaimed {
				t.Fatalf("outcome %d, want claimed", claim.Outcome)
			}
			b.claims.Settle(context.Background(), r, claim.At, tc.answer, tc.marked)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			b.claims.Close(ctx) // writes the queued marks
			got, ok := b.recs.record(b.tenant, "k")
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
	if got := b.claims.Claim(context.Background(), context.Background(), r, Taken{}); got.Outcome != OutcomeClaimed {
		t.Fatalf("outcome %d, want claimed", got.Outcome)
	}
	b.recs.mu.Lock()
	b.recs.abortFails = 2
	b.recs.mu.Unlock()
	b.claims.Release(context.Background(), r)
	deadline := time.Now().Add(10 * AbortRetry)
	for time.Now().Before(deadline) {
		if _, ok := b.recs.record(b.tenant, "k"); !ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rec, ok := b.recs.record(b.tenant, "k"); ok {
		t.Fatalf("claim %+v still there", rec)
	}
	if _, aborts := b.recs.counts(); aborts != 3 {
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
