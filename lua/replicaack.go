package lua

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// ReplicaAcksAuto asks each money operation to wait for one replica when
// the master serving its slot has connected replicas (INFO replication),
// and for none when it has none.
const ReplicaAcksAuto = -1

// DefaultReplicaAckTimeout bounds the WAIT after a money script: a replica
// on the same network acknowledges in well under a millisecond, so 50 ms
// only runs out when a replica is stalled or gone.
const DefaultReplicaAckTimeout = 50 * time.Millisecond

// replicaCountTTL is how long a master's replica count (auto mode) is
// trusted before INFO replication is asked again.
const replicaCountTTL = time.Second

// replicaAck is the Store's replica acknowledgement setting and, in auto
// mode, the replica count last seen on each master.
type replicaAck struct {
	want    int // ReplicaAcksAuto, 0 (off) or the replicas to wait for
	timeout time.Duration
	counts  sync.Map // *redis.Client -> *replicaCount
}

// replicaCount is one master's connected replicas as INFO last said.
type replicaCount struct {
	n       atomic.Int64
	checked atomic.Int64 // unix ns of the last INFO
	busy    atomic.Bool  // an INFO is under way
	// first serializes the looks before the first answer (checked 0).
	first sync.Mutex
	// had: this master was once seen with a replica. From then on it
	// counts at least one, whatever INFO says at that second: a replica
	// whose link is down counts none, and acknowledging without it would
	// lose the operations if the master then died (make chaos's replica
	// stall found it). Its writes answer 503 until a replica is back
	// (durability first); a fleet that drops replication for good sets
	// CREDITD_REPLICA_ACKS=0. A master promoted a moment ago (a new
	// master_replid, even behind the same address) was never seen with
	// one, so it acknowledges alone until its replica rejoins: only a
	// second failure inside that window could lose an operation.
	had atomic.Bool
	// replid is the master_replid of the server that was seen with a
	// replica. A new one is another history (a replica promoted behind the
	// same address, a master restarted empty): had starts over.
	replid atomic.Value // string
}

// WithReplicaAcks makes every money operation wait, after its script, until
// n replicas acknowledged the script's writes (WAIT n timeout on the same
// connection, in the same round trip): ReplicaAcksAuto waits for one when
// the slot's master has replicas, 0 never waits. A wait that runs out
// answers engine.ErrNotReplicated: the operation applied on the master but
// is not acknowledged, and a retry with its idempotency key replays it and
// waits again. A timeout <= 0 is DefaultReplicaAckTimeout.
func (s *Store) WithReplicaAcks(n int, timeout time.Duration) *Store {
	if timeout <= 0 {
		timeout = DefaultReplicaAckTimeout
	}
	// WAIT takes whole milliseconds and 0 means forever.
	timeout = max(timeout, time.Millisecond)
	s.acks = &replicaAck{want: max(n, ReplicaAcksAuto), timeout: timeout}
	return s
}

// ackNode is the client of the master serving key's slot, the one a
// script and its WAIT must share a connection on; ok is false when acks are
// off or the client type has no single master per key (a Ring).
func (s *Store) ackNode(ctx context.Context, key string) (*redis.Client, int, error) {
	if s.acks == nil || s.acks.want == 0 {
		return nil, 0, nil
	}
	var node *redis.Client
	switch c := s.rdb.(type) {
	case *redis.Client:
		node = c
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, key); err != nil {
			return nil, 0, err
		}
	default:
		return nil, 0, nil
	}
	if s.acks.want > 0 {
		return node, s.acks.want, nil
	}
	return node, min(s.replicasOf(ctx, node), 1), nil
}

// replicasOf is node's connected replicas, from a cache refreshed at most
// once a second, in the background after the first look.
func (s *Store) replicasOf(ctx context.Context, node *redis.Client) int {
	v, loaded := s.acks.counts.Load(node)
	if !loaded {
		v, _ = s.acks.counts.LoadOrStore(node, &replicaCount{})
	}
	rc := v.(*replicaCount)
	now := time.Now().UnixNano()
	if rc.checked.Load() == 0 {
		// First look at this master: ask before answering, so a fresh
		// process never acknowledges its first operations unreplicated.
		// Concurrent first calls wait for the one asking (they used to
		// answer the count's zero value at once, acknowledging alone).
		rc.first.Lock()
		defer rc.first.Unlock()
		if rc.checked.Load() == 0 {
			rc.busy.Store(true)
			rc.refresh(ctx, node)
		}
		return int(rc.n.Load())
	}
	if now-rc.checked.Load() > int64(replicaCountTTL) && rc.busy.CompareAndSwap(false, true) {
		go rc.refresh(context.WithoutCancel(ctx), node)
	}
	return int(rc.n.Load())
}

// refresh reads connected_slaves from node's INFO replication; a server
// that refuses it (an embedded miniredis answers an error) counts none.
// A look that got no answer at all (a timeout on a loaded box, a dropped
// connection) tells nothing about the replicas: the count stays as it was
// and is asked again after replicaCountTTL. Taking it for "no replicas"
// once made a master seen with one acknowledge and persist unreplicated
// operations for a second (had reset with the replid it could not read),
// which a failover then forks (TestRefreshKeepsCountWithoutAnswer).
func (rc *replicaCount) refresh(ctx context.Context, node *redis.Client) {
	defer rc.busy.Store(false)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	n, id := int64(0), ""
	info, err := node.Info(ctx, "replication").Result()
	var refused redis.Error
	switch {
	case err == nil:
		n, id = connectedReplicas(info), replicationID(info)
	case !errors.As(err, &refused):
		if rc.checked.Load() == 0 {
			// A first look without an answer: wait for one replica (a
			// master without any answers ErrNotReplicated, and the next
			// call asks again), never acknowledge unreplicated.
			rc.n.Store(1)
			return
		}
		rc.checked.Store(time.Now().UnixNano())
		return
	}
	if prev, _ := rc.replid.Load().(string); id != prev {
		rc.had.Store(false)
		rc.replid.Store(id)
	}
	if n > 0 {
		rc.had.Store(true)
	} else if rc.had.Load() {
		n = 1
	}
	rc.n.Store(n)
	rc.checked.Store(time.Now().UnixNano())
}

// replicationID is the master_replid field of an INFO replication text,
// "" when absent.
func replicationID(info string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_replid:"); ok {
			return v
		}
	}
	return ""
}

// connectedReplicas is the connected_slaves field of an INFO replication
// text, 0 when absent.
func connectedReplicas(info string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// runAcked runs script on node followed by WAIT want on the same
// connection, in one pipelined round trip (WAIT counts the writes of the
// connection that sends it). It returns the script's reply and the replicas
// that acknowledged. A slot that moved away from node (MOVED, ASK) runs
// the script through the cluster client instead, which follows the
// redirect, and answers no acknowledgement: acknowledged marks the slot.
func (s *Store) runAcked(ctx context.Context, node *redis.Client, script *script, keys []string, args []any, want int) (any, int, error) {
	for attempt := 0; attempt < 2; attempt++ {
		pipe := node.Pipeline()
		var c *redis.Cmd
		if attempt > 0 {
			// The node lacked the code (a restart, a new version): load it
			// there, then run it again.
			if err := s.prepareOn(ctx, node, script); err != nil {
				return nil, 0, err
			}
		}
		c = s.queue(ctx, pipe, script, keys, args...)
		w := pipe.Do(ctx, "wait", want, s.acks.timeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		v, err := c.Result()
		switch {
		case err != nil && attempt == 0 && s.missing(err):
			continue // after a server restart: send the text
		case err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")):
			// The script ran on another connection, so no WAIT here
			// covers it: none acknowledged yet, and acknowledged then
			// waits through one fresh mark (ackMark), replay or not.
			if v, err = s.call(ctx, script, keys, args...).Result(); err != nil {
				return nil, 0, err
			}
			return v, 0, nil
		case err != nil:
			return nil, 0, err
		}
		acked, werr := w.Int64()
		if werr != nil {
			return v, 0, nil
		}
		return v, int(acked), nil
	}
	return nil, 0, errors.New("lua: the script is not loaded")
}

// ackMark writes a short-lived mark in key's slot and waits for want
// replicas to acknowledge it, on one connection to the slot's master, and
// returns how many did. It acknowledges a replay: the replayed script wrote
// nothing, so WAIT alone would only cover this connection's older writes,
// while the write being replayed may have come from another connection;
// the master's replication stream is ordered, so a replica that has the
// mark has every earlier write of the slot, the replayed one included.
func (s *Store) ackMark(ctx context.Context, key string, want int) int {
	node, _, err := s.ackNode(ctx, key)
	if err != nil || node == nil {
		return 0
	}
	mark := key
	if i := strings.IndexByte(key, '}'); i >= 0 {
		mark = key[:i+1]
	}
	pipe := node.Pipeline()
	pipe.Set(ctx, mark+":ackmark", "1", time.Minute)
	w := pipe.Do(ctx, "wait", want, s.acks.timeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	acked, err := w.Int64()
	if err != nil {
		return 0
	}
	return int(acked)
}

// acknowledged reports whether a money operation's result may be answered:
// it reached want replicas, or a replay's fresh mark did.
func (s *Store) acknowledged(ctx context.Context, res engine.MutationResult, key string, acked, want int) bool {
	if acked >= want {
		if !res.Replayed {
			return true
		}
		// The replayed script wrote nothing: acked covers this
		// connection's earlier writes only (see ackMark).
	}
	return s.ackMark(ctx, key, want) >= want
}
