package main

import "testing"

// TestTelemetryBuild: creditd_build_info names the stamped version and
// commit, and falls back to the toolchain's record only where no stamp is.
func TestTelemetryBuild(t *testing.T) {
	for _, tc := range []struct {
		name                string
		in                  build
		wantVersion, commit string
	}{
		{"stamped", build{Version: "v0.3.0", Commit: "f59513c64d9639e5d069287fd242f6ad7d9c0969"}, "v0.3.0", "f59513c64d9639e5d069287fd242f6ad7d9c0969"},
		{"commit only", build{Version: "unknown", Commit: "abc"}, "", "abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := telemetryBuild(tc.in)
			if tc.wantVersion != "" && got.Version != tc.wantVersion {
				t.Fatalf("version %q, want %q", got.Version, tc.wantVersion)
			}
			if tc.wantVersion == "" && got.Version == "unknown" {
				t.Fatalf("version %q: an unstamped version must fall back to the toolchain's", got.Version)
			}
			if got.Commit != tc.commit {
				t.Fatalf("commit %q, want %q", got.Commit, tc.commit)
			}
		})
	}
}
