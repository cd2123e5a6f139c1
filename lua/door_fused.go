package lua

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

//go:embed door_fused.lua
var doorFusedLua string

// Compile-time check that Store can fuse a request's door into its money
// script.
var _ engine.DoorFuser = (*Store)(nil)

// FusesDoors reports whether a money script can carry its request's door
// (engine.FusedDoor): only on a single Redis, where the tenant's stamps,
// the key's record and the customer's account share the one node, whose
// scripts run as the library's functions, and when no replica
// acknowledgement can be asked (runAcked sends the script by itself).
func (s *Store) FusesDoors() bool {
	node, single := s.rdb.(*redis.Client)
	if !single || s.noFunctions() {
		return false
	}
	switch {
	case s.acks == nil || s.acks.want == 0:
		return true
	case s.acks.want > 0:
		return false
	}
	// Auto: acknowledgements are asked only of a master with replicas
	// (ackNode), from a count cached a second at a time.
	return s.replicasOf(context.Background(), node) == 0
}

// doorShapeArgs[shape] is door_fused.lua's last argument, boxed once: 1
// stamps checked + 2 rate asked + 4 notice asked + 8 index asked.
var doorShapeArgs = [16]any{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15"}

// fusedArgs are door_fused.lua's keys (the script's own, then the door's)
// and the whole FCALL of fn (fcallArgv): its keys, the script's arguments
// and the door's, built in place; ix, when set, is a reserve's index
// record for the door to write.
func (s *Store) fusedArgs(fn string, d *engine.FusedDoor, ix *reservationIndex, keys []string, args []any) ([]string, []any, error) {
	lockMS, err := idemTTLMillis("lock TTL", d.LockTTL)
	if err != nil {
		return nil, nil, err
	}
	windowMS, err := idemTTLMillis("TTL", d.Window)
	if err != nil {
		return nil, nil, err
	}
	r := d.Rate
	if r != nil && (r.PerSecond < 1 || r.Burst < 1 || r.Requests < 1) {
		return nil, nil, rateArgsError(r.PerSecond, r.Burst, r.Requests)
	}
	c := d.ReservationNote
	shape := 0
	k := make([]string, 0, len(keys)+5)
	k = append(k, keys...)
	k = append(k, s.stampsKey(d.Tenant), s.idemRecordKey(d.Tenant, d.Key))
	if r != nil {
		k = append(k, s.rateKey(d.Tenant, r.Key))
		shape |= 2
	}
	if c != nil {
		k = append(k, s.changesKey(c.TenantID))
		shape |= 4
	}
	if ix != nil {
		k = append(k, ix.key)
		shape |= 8
	}
	a := fcallHead(fn, k, len(args)+22)
	a = append(a, args...)
	a = append(a, idemHead(idemRunning, d.Tenant, d.RequestHash), idemHead(idemRerun, d.Tenant, d.RequestHash), lockMS, windowMS)
	if d.Checked {
		shape |= 1
		a = append(a, stampsText(&d.Stamps))
	}
	if r != nil {
		var nowMicros int64
		if !r.Now.IsZero() {
			nowMicros = r.Now.UnixMicro()
		}
		a = append(a, r.PerSecond, r.Burst, nowMicros, r.Requests)
	}
	if c != nil {
		a = s.appendNoteArgs(a, c)
	}
	if ix != nil {
		a = append(a, ix.record, ix.ttlMS)
	}
	return k, append(a, doorShapeArgs[shape]), nil
}

// stampsText is stamps as door_fused.lua compares them: their decimal
// values joined by spaces, in kind order. One argument instead of six
// costs Redis a few thousand instructions less a call.
func stampsText(stamps *engine.TenantStamps) string {
	var buf [len(engine.TenantStamps{}) * 21]byte
	b := buf[:0]
	for i, v := range stamps {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, v, 10)
	}
	return string(b)
}

// fusedError is a body's refusal carried in door_fused.lua's reply, the
// Redis error it would have been on its own (scriptError reads it).
type fusedError string

func (e fusedError) Error() string { return string(e) }
func (fusedError) RedisError()     {}

// callFused runs sc under the fused door d (door_fused.lua) and settles d
// by its reply: stale (nothing ran: engine.ErrFusedStale), refused by the
// rate (engine.ErrFusedStale too, the door's outcome telling which), the
// rerun mark (an answer), the claim (a refusal), or unsettled (an error
// whose caller runs the script again, as door_fused.lua says, or no
// answer at all). What it returns is the body's reply or error.
func (s *Store) callFused(ctx context.Context, sc *script, d *engine.FusedDoor, keys []string, args []any) (any, error) {
	ix := reservationIndexOf(ctx)
	k, argv, err := s.fusedArgs(sc.doorFn(), d, ix, keys, args)
	if err != nil {
		return nil, err
	}
	cmd := s.fcallArgv(ctx, argv, len(k))
	if isMissingCode(cmd.Err()) {
		if lerr := s.loadLibraryFor(ctx, k); lerr == nil {
			cmd = s.fcallArgv(ctx, argv, len(k))
		}
	}
	v, err := cmd.Result()
	if err != nil {
		return nil, err // never answered: the door is as it was
	}
	parts, ok := v.([]any)
	if !ok || len(parts) < 6 || parts[0] != "door" {
		return nil, fmt.Errorf("lua: %s under a fused door: unexpected reply %T", sc.name, v)
	}
	var fig [4]int64
	for i := range fig {
		if fig[i], ok = parts[2+i].(int64); !ok {
			return nil, fmt.Errorf("lua: %s under a fused door: rate figure %d is %T", sc.name, i, parts[2+i])
		}
	}
	if fig[0] != -2 && d.Rate != nil {
		d.Took(engine.RateDecision{
			Allowed:    fig[0] > 0,
			Granted:    int(max(fig[0], 0)),
			Limit:      d.Rate.Burst,
			Remaining:  int(fig[1]),
			RetryAfter: time.Duration(fig[2]) * time.Microsecond,
			Reset:      time.Duration(fig[3]) * time.Microsecond,
		})
	}
	switch what, _ := parts[1].(string); {
	case what == "stale":
		d.Settle(engine.FusedStale)
		return nil, engine.ErrFusedStale
	case what == "rate":
		d.Settle(engine.FusedRateRefused)
		return nil, engine.ErrFusedStale
	case (what == "err" || what == "retry") && len(parts) == 7:
		if what == "err" {
			d.Settle(engine.FusedClaimed)
		}
		text, _ := parts[6].(string)
		return nil, fusedError(text)
	case what == "ok" && len(parts) == 8:
		d.Settle(engine.FusedMarked)
		if d.ReservationNote != nil && parts[6] != replyReplay {
			d.Noted = true
		}
		if ix != nil && parts[6] != replyReplay {
			ix.written = true
		}
		return parts[6:8], nil
	}
	return nil, fmt.Errorf("lua: %s under a fused door: unexpected reply %v", sc.name, parts[:2])
}
