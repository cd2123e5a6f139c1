package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/creditd/creditd/internal/telemetry"
)

// Stamped at build by -ldflags "-X main.version=... -X main.commit=...
// -X main.date=..." (Makefile `build`, Dockerfile); empty when built
// without them, and buildInfo falls back to what the Go toolchain recorded.
var (
	version string
	commit  string
	date    string
)

// build is what `creditd version` prints: which code this binary is.
type build struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Date    string `json:"date"`
	Go      string `json:"go"`
}

// buildInfo returns the stamped values, else the module version and the
// vcs.revision / vcs.time settings `go build` records in a checkout (absent
// with -buildvcs=false), else "unknown".
func buildInfo() build {
	b := build{Version: version, Commit: commit, Date: date, Go: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && info.Main.Version != "" {
			b.Version = info.Main.Version
		}
		modified := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Commit == "" {
					b.Commit = s.Value
				}
			case "vcs.time":
				if b.Date == "" {
					b.Date = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && commit == "" && b.Commit != "" {
			b.Commit += "-dirty"
		}
	}
	for _, f := range []*string{&b.Version, &b.Commit, &b.Date} {
		if *f == "" {
			*f = "unknown"
		}
	}
	return b
}

// String is the one line of `creditd version` and `creditd --version`.
func (b build) String() string {
	return fmt.Sprintf("creditd %s (commit %s, built %s, %s)", b.Version, b.Commit, b.Date, b.Go)
}

// telemetryBuild is what creditd_build_info and the traces name: the
// stamp of `make build` and the Dockerfile where there is one. The
// toolchain's own record alone is empty in a -buildvcs=false build or one
// from an extracted tree (`make upgrade-test` builds releases so), and
// then every node of a rolling upgrade would read "devel", "unknown".
func telemetryBuild(b build) telemetry.Build {
	t := telemetry.BuildFromBinary()
	if b.Version != "unknown" {
		t.Version = b.Version
	}
	if b.Commit != "unknown" {
		t.Commit = b.Commit
	}
	return t
}
