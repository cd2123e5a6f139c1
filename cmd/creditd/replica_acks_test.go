package main

import (
	"testing"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
)

// TestReplicaAcksSetting: unset and "auto" wait when there are replicas, 0
// turns the wait off (app's ReplicaAcksOff, since app's zero is auto), a
// count passes through, and anything else stops serve.
func TestReplicaAcksSetting(t *testing.T) {
	for _, tc := range []struct {
		env     string
		acks    int
		app     int
		refused bool
	}{
		{"", lua.ReplicaAcksAuto, lua.ReplicaAcksAuto, false},
		{"auto", lua.ReplicaAcksAuto, lua.ReplicaAcksAuto, false},
		{"0", 0, app.ReplicaAcksOff, false},
		{"2", 2, 2, false},
		{"-3", lua.ReplicaAcksAuto, lua.ReplicaAcksAuto, true},
		{"one", lua.ReplicaAcksAuto, lua.ReplicaAcksAuto, true},
	} {
		t.Setenv("CREDITD_REPLICA_ACKS", tc.env)
		cfg := loadConfig()
		if cfg.ReplicaAcks != tc.acks || cfg.appReplicaAcks() != tc.app || (cfg.check() != nil) != tc.refused {
			t.Errorf("%q: acks %d app %d check %v, want %d %d refused=%v", tc.env, cfg.ReplicaAcks, cfg.appReplicaAcks(), cfg.check(), tc.acks, tc.app, tc.refused)
		}
	}
}
