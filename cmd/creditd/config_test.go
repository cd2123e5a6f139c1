package main

import (
	"strings"
	"testing"
)

// TestConfigAdminToken: serve refuses an admin token under 32 characters
// with a message naming the variable; unset (admin API off) and long
// tokens pass.
func TestConfigAdminToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, token string
		ok          bool
	}{
		{"unset", "", true},
		{"31 characters", strings.Repeat("t", 31), false},
		{"dev default of old", "dev-admin-token", false},
		{"32 characters", strings.Repeat("t", 32), true},
		{"64 hex", strings.Repeat("ab", 32), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := config{AdminToken: tc.token}.check()
			if tc.ok != (err == nil) {
				t.Fatalf("check(%q) = %v, want ok=%v", tc.token, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "CREDITD_ADMIN_TOKEN") {
				t.Fatalf("error does not name the variable: %v", err)
			}
		})
	}
}

// TestConfigMaxConnsPerIP: CREDITD_MAX_CONNS_PER_IP sets the per-client
// cap; unset or invalid keeps 1,024.
func TestConfigMaxConnsPerIP(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  int
	}{{"", 1024}, {"50", 50}, {"-3", 1024}, {"many", 1024}} {
		t.Setenv("CREDITD_MAX_CONNS_PER_IP", tc.value)
		if got := loadConfig().MaxConnsPerIP; got != tc.want {
			t.Errorf("CREDITD_MAX_CONNS_PER_IP=%q: %d, want %d", tc.value, got, tc.want)
		}
	}
}
