package lua

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

// TestOutboxMarks: a mark names the newest entry of the customer's
// partition (or of every partition); it is persisted once every entry up
// to it has been acknowledged (deleted), whatever came after it.
func TestOutboxMarks(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		customer := uuid.New()
		p := Partition(customer)
		other := (p + 1) % Partitions
		if m, err := b.store.OutboxMark(ctx, &customer); err != nil || len(m.Partitions) != 0 {
			t.Fatalf("mark of an empty partition = %+v, %v; want none", m, err)
		}
		xadd(t, b, p, "", outboxMutation(t))
		second := xadd(t, b, p, "", outboxMutation(t))
		xadd(t, b, other, "", outboxMutation(t))
		mark, err := b.store.OutboxMark(ctx, &customer)
		if err != nil || len(mark.Partitions) != 1 || mark.Partitions[0] != p || mark.Entries[0] != second {
			t.Fatalf("customer mark = %+v, %v; want partition %d at %s", mark, err, p, second)
		}
		all, err := b.store.OutboxMark(ctx, nil)
		if err != nil || len(all.Partitions) != 2 {
			t.Fatalf("mark of every partition = %+v, %v; want partitions %d and %d", all, err, p, other)
		}
		xadd(t, b, p, "", outboxMutation(t)) // after the mark: not waited for
		if done, err := b.store.OutboxPersisted(ctx, mark); err != nil || done {
			t.Fatalf("persisted before any ack = %v, %v", done, err)
		}
		got, err := b.store.Read(ctx, p, "c1", 2, 0)
		if err != nil || len(got) != 2 {
			t.Fatalf("read %d, %v", len(got), err)
		}
		if err := b.store.Ack(ctx, p, msgIDs(got)); err != nil {
			t.Fatal(err)
		}
		if done, err := b.store.OutboxPersisted(ctx, mark); err != nil || !done {
			t.Fatalf("persisted after the ack of everything up to the mark = %v, %v", done, err)
		}
		if done, err := b.store.OutboxPersisted(ctx, all); err != nil || done {
			t.Fatalf("every partition persisted while %d holds an entry = %v, %v", other, done, err)
		}
	})
}
