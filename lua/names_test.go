package lua

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
)

// TestScriptName: every library script is named from its FCALL function
// and its EVALSHA hash, the stand-alone scripts from their hash, and other
// commands are not scripts.
func TestScriptName(t *testing.T) {
	library()
	for _, sc := range libraryScripts {
		for _, args := range [][]any{{"fcall", sc.fnName, 1}, {"FCALL", sc.fnName}, {"evalsha", sc.eval.Hash(), 1}} {
			if got, ok := ScriptName(args); !ok || got != sc.name {
				t.Errorf("ScriptName(%v) = %q %v, want %q", args, got, ok, sc.name)
			}
		}
	}
	for _, tc := range []struct {
		args []any
		want string
		ok   bool
	}{
		{[]any{"evalsha", gcraScript.Hash()}, "gcra", true},
		{[]any{"evalsha", idemFinishScript.Hash()}, "idem_finish", true},
		{[]any{"eval", "return 1", 0}, "eval", true},
		{[]any{"evalsha", "0000000000000000000000000000000000000000"}, "", false},
		{[]any{"get", "k"}, "", false},
		{[]any{"fcall"}, "", false},
	} {
		if got, ok := ScriptName(tc.args); got != tc.want || ok != tc.ok {
			t.Errorf("ScriptName(%v) = %q %v, want %q %v", tc.args, got, ok, tc.want, tc.ok)
		}
	}
	if n := len(LibraryScriptNames()); n != len(libraryScripts) || n == 0 {
		t.Errorf("LibraryScriptNames: %d names for %d scripts", n, len(libraryScripts))
	}
	if allocs := testing.AllocsPerRun(100, func() { ScriptName([]any{"fcall", libraryScripts[0].fnName, 1}) }); allocs != 0 {
		t.Errorf("ScriptName allocates %v times", allocs)
	}
}

// TestReservationBacklog: the reservation sweep's backlog counts, per partition, the
// reservations scored at or before now, not the later ones.
func TestReservationBacklog(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s := NewStore(rdb, prefix)
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(d time.Duration) float64 { return float64(now.Add(d).UnixMilli()) }
	rdb.ZAdd(ctx, s.reservationExpiryKey(5), redis.Z{Score: ms(-time.Second), Member: "h"}, redis.Z{Score: ms(0), Member: "i"},
		redis.Z{Score: ms(time.Minute), Member: "j"})
	reservations, err := s.ReservationBacklog(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	for p := range Partitions {
		want := int64(0)
		if p == 5 {
			want = 2
		}
		if reservations[p] != want {
			t.Errorf("partition %d: %d reservations, want %d", p, reservations[p], want)
		}
	}
}
