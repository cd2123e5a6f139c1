package lua

import "context"

// Replicated reports whether every outbox entry of partition p appended so
// far has reached the replicas money operations wait for (WithReplicaAcks):
// a mark written in the partition's slot after them, and WAIT for it, on
// one connection to the slot's master (ackMark; the master's replication
// stream is ordered, so a replica holding the mark holds every earlier
// entry). It is true at once when acks are off or, in auto mode, while the
// master has no replicas.
//
// The persister asks it before storing a batch (issue 11): an entry the
// master ran but never replicated vanishes with it in a failover, and
// Postgres must never hold an op the promoted replica lacks, or the
// replica's next op on that customer forks its history.
func (s *Store) Replicated(ctx context.Context, p int) (bool, error) {
	if err := s.checkOutboxPartition(p); err != nil {
		return false, err
	}
	key := s.outboxKey(p)
	_, want, err := s.ackNode(ctx, key)
	if err != nil {
		return false, err
	}
	if want == 0 {
		return true, nil
	}
	return s.ackMark(ctx, key, want) >= want, nil
}
