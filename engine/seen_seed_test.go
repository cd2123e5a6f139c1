package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine/idempotency"
)

// fakeSeen is the seen filter's marks and the keys recorded in it.
type fakeSeen struct {
	marks []time.Time
	keys  []OpRef
	fail  error
}

func (f *fakeSeen) SeenSeeded(context.Context) ([]time.Time, error) {
	return append([]time.Time(nil), f.marks...), f.fail
}

func (f *fakeSeen) SeedSeen(_ context.Context, refs []OpRef, parts []int, from time.Time, done bool) error {
	f.keys = append(f.keys, refs...)
	if done {
		for _, p := range parts {
			f.marks[p] = from
		}
	}
	return nil
}

// fakeAppliedKeys is Postgres's operations, by creation instant.
type fakeAppliedKeys struct {
	ops    map[time.Time]OpRef
	asked  []time.Time // each read's since
	broken bool
}

func (f *fakeAppliedKeys) AppliedKeysSince(_ context.Context, since time.Time, page int, fn func([]OpRef) error) error {
	f.asked = append(f.asked, since)
	if f.broken {
		return errors.New("connection refused")
	}
	var refs []OpRef
	for at, r := range f.ops {
		if !at.Before(since) {
			refs = append(refs, r)
		}
	}
	for len(refs) > 0 {
		n := min(page, len(refs))
		if err := fn(refs[:n]); err != nil {
			return err
		}
		refs = refs[n:]
	}
	return nil
}

// TestSeenSeeder (issue 26): a first start seeds every partition never
// seeded from the whole horizon and marks them all; a later start reads
// only from its last seeding less the overlap (what a previous release's
// persister committed without recording it); between starts only a
// partition whose mark vanished (lost Redis data) is seeded again; a
// failed read marks nothing, so those money calls keep asking Postgres.
func TestSeenSeeder(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	old, recent := now.Add(-20*24*time.Hour), now.Add(-10*time.Minute)
	tooOld := now.Add(-idempotency.SeenHorizon - time.Hour)
	ref := func() OpRef { return OpRef{Customer: CustomerKey{CustomerID: uuid.New()}, Key: uuid.NewString()} }
	pg := &fakeAppliedKeys{ops: map[time.Time]OpRef{old: ref(), recent: ref(), tooOld: ref()}}
	seen := &fakeSeen{marks: make([]time.Time, 4)}
	s := &SeenSeeder{Filter: seen, Keys: pg, Clock: fixedNow(now), Page: 1, Log: zerolog.Nop()}

	pg.broken = true
	if err := s.SeedOnce(context.Background()); err == nil {
		t.Fatal("a failed read reported success")
	}
	for p, m := range seen.marks {
		if !m.IsZero() {
			t.Fatalf("partition %d marked after a failed read", p)
		}
	}
	pg.broken = false

	if err := s.SeedOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := pg.asked[len(pg.asked)-1]; !got.Equal(now.Add(-idempotency.SeenHorizon)) {
		t.Errorf("first seeding read from %s, want the horizon %s", got, now.Add(-idempotency.SeenHorizon))
	}
	if len(seen.keys) != 2 {
		t.Errorf("first seeding recorded %d keys, want 2 (the one past the horizon left out)", len(seen.keys))
	}
	for p, m := range seen.marks {
		if !m.Equal(now) {
			t.Errorf("partition %d mark %s, want %s", p, m, now)
		}
	}

	// Nothing vanished: the periodic pass reads nothing.
	reads := len(pg.asked)
	if err := s.SeedOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(pg.asked) != reads {
		t.Errorf("a pass with every partition seeded read Postgres")
	}

	// One mark vanished: that partition is seeded from the horizon again.
	seen.marks[2] = time.Time{}
	if err := s.SeedOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(pg.asked) != reads+1 || !pg.asked[reads].Equal(now.Add(-idempotency.SeenHorizon)) || !seen.marks[2].Equal(now) {
		t.Errorf("vanished mark: reads %v, mark %s", pg.asked[reads:], seen.marks[2])
	}

	// A restart an hour later reads from the last seeding less the overlap.
	restart := &SeenSeeder{Filter: seen, Keys: pg, Clock: fixedNow(now.Add(time.Hour)), Log: zerolog.Nop()}
	if err := restart.SeedOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := pg.asked[len(pg.asked)-1]; !got.Equal(now.Add(-SeenSeedOverlap)) {
		t.Errorf("restart read from %s, want %s", got, now.Add(-SeenSeedOverlap))
	}
}
