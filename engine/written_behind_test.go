package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// fakeMarks is an outbox whose entries up to any mark are persisted after
// doneAfter looks (never when negative).
type fakeMarks struct {
	markErr   error
	empty     bool
	doneAfter int
	looks     int
	asked     *uuid.UUID
	hurried   int
}

func (f *fakeMarks) OutboxMark(_ context.Context, customer *uuid.UUID) (OutboxMark, error) {
	f.asked = customer
	if f.markErr != nil || f.empty {
		return OutboxMark{}, f.markErr
	}
	return OutboxMark{Partitions: []int{7}, Entries: []string{"1-0"}}, nil
}

func (f *fakeMarks) OutboxPersisted(context.Context, OutboxMark) (bool, error) {
	f.looks++
	return f.doneAfter >= 0 && f.looks > f.doneAfter, nil
}

// TestWrittenBehindWaits: a read waits until the outbox as it stood has
// reached Postgres, hurrying the local persister meanwhile; it gives up at
// its bound, and waits for nothing when the outbox is empty, Redis cannot
// say, or there is no WrittenBehind.
func TestWrittenBehindWaits(t *testing.T) {
	tests := []struct {
		name      string
		marks     *fakeMarks
		wantLooks int
		wantWait  bool
	}{
		{"persisted at once", &fakeMarks{doneAfter: 0}, 1, false},
		{"persisted on the fourth look", &fakeMarks{doneAfter: 3}, 4, false},
		{"never persisted: the bound", &fakeMarks{doneAfter: -1}, -1, true},
		{"empty outbox", &fakeMarks{empty: true}, 0, false},
		{"redis cannot say", &fakeMarks{markErr: errors.New("down")}, 0, false},
	}
	for _, tt := range tests {
		hurried := 0
		w := NewWrittenBehind(tt.marks, func() { hurried++ })
		w.wait = 50 * time.Millisecond
		customer := uuid.New()
		start := time.Now()
		w.Customer(context.Background(), customer)
		took := time.Since(start)
		if tt.marks.asked == nil || *tt.marks.asked != customer {
			t.Errorf("%s: marked %v, want the customer's partition", tt.name, tt.marks.asked)
		}
		if tt.wantLooks >= 0 && tt.marks.looks != tt.wantLooks {
			t.Errorf("%s: %d looks, want %d", tt.name, tt.marks.looks, tt.wantLooks)
		}
		if tt.wantLooks > 1 && hurried != tt.wantLooks-1 {
			t.Errorf("%s: hurried %d times, want %d", tt.name, hurried, tt.wantLooks-1)
		}
		if tt.wantWait != (took >= w.wait) {
			t.Errorf("%s: took %s, bound %s, want waited to the bound: %v", tt.name, took, w.wait, tt.wantWait)
		}
	}
	all := &fakeMarks{doneAfter: 0}
	NewWrittenBehind(all, nil).All(context.Background())
	if all.asked != nil || all.looks != 1 {
		t.Errorf("All marked customer %v with %d looks, want every partition and one look", all.asked, all.looks)
	}
	var none *WrittenBehind
	none.All(context.Background()) // a nil WrittenBehind waits for nothing
}
