package lua

import (
	"sync"
	"time"

	"github.com/google/uuid"
)

// reservationRefs remembers the index records this node wrote
// (indexReservation), so a commit or release of a reservation made here
// finds its customer and metric without the MGET ReservationRef would send:
// one Redis round trip less per commit on the node that took the
// reservation (a node that did not falls back to the MGET). A record never
// changes for a reservation id, so a remembered one is as good as Redis's;
// a reservation Redis no longer holds is refused by its script either way
// and settles through Postgres (engine.Reservations.hotMiss).
type reservationRefs struct {
	mu sync.Mutex
	m  map[uuid.UUID]reservationRefEntry
}

// reservationRefEntry is one remembered record and when Redis drops its
// copy (the record's TTL, counted on the service's clock).
type reservationRefEntry struct {
	record string
	until  time.Time
}

// maxReservationRefs bounds the memory (~200 B an entry): a full set
// starts over, as the other node-local caches do.
const maxReservationRefs = 32_768

// put remembers record of reservation id until until.
func (r *reservationRefs) put(id uuid.UUID, record string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) >= maxReservationRefs {
		r.m = make(map[uuid.UUID]reservationRefEntry, 1024)
	}
	r.m[id] = reservationRefEntry{record: record, until: until}
}

// get is reservation id's remembered record while it is younger than its
// TTL at now.
func (r *reservationRefs) get(id uuid.UUID, now time.Time) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[id]
	if !ok {
		return "", false
	}
	if !now.Before(e.until) {
		delete(r.m, id)
		return "", false
	}
	return e.record, true
}
