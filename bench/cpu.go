package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on every
// Linux the bench runs on).
const clockTicks = 100

// procTimes reads utime+stime (own threads) and cutime+cstime (children
// waited for) of pid, in seconds.
func procTimes(pid int) (self, children float64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// comm may hold spaces: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is state (field 3); utime is field 14 -> f[11].
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v / clockTicks }
	ppid, _ = strconv.Atoi(f[1])
	return num(11) + num(12), num(13) + num(14), ppid, nil
}

// CPUProbe samples the CPU seconds of the processes a run involves.
type CPUProbe struct {
	Creditd    int // pid, 0 when not running
	Redis      int
	Postmaster int
	Extra      map[string]int // other processes by name (the ceiling server)
}

// CPUSample is cumulative CPU seconds per process name.
type CPUSample map[string]float64

// Sample reads every process now. Postgres is the postmaster's own time, the
// time of children it already reaped (cutime), and each live child's time;
// so backends that come and go between samples are still counted.
func (p *CPUProbe) Sample() CPUSample {
	out := CPUSample{}
	if p.Creditd > 0 {
		if s, _, _, err := procTimes(p.Creditd); err == nil {
			out["creditd"] = s
		}
	}
	if p.Redis > 0 {
		if s, _, _, err := procTimes(p.Redis); err == nil {
			out["redis-server"] = s
		}
	}
	if p.Postmaster > 0 {
		if s, c, _, err := procTimes(p.Postmaster); err == nil {
			total := s + c
			for _, pid := range childrenOf(p.Postmaster) {
				if cs, _, _, err := procTimes(pid); err == nil {
					total += cs
				}
			}
			out["postgres"] = total
		}
	}
	for name, pid := range p.Extra {
		if s, _, _, err := procTimes(pid); err == nil {
			out[name] = s
		}
	}
	if s, _, _, err := procTimes(os.Getpid()); err == nil {
		out["bench (load generator)"] = s
	}
	out[machineKey] = machineBusy()
	return out
}

// machineKey holds the whole machine's busy CPU seconds in a sample; Sub
// turns it into otherKey, what processes outside the run used.
const (
	machineKey = "machine"
	otherKey   = "other processes"
)

// Sub is the CPU seconds spent between two samples.
func (s CPUSample) Sub(before CPUSample) CPUSample {
	out := CPUSample{}
	for k, v := range s {
		if b, ok := before[k]; ok && k != machineKey {
			out[k] = v - b
		}
	}
	if m, ok := s[machineKey]; ok {
		other := m - before[machineKey]
		for _, v := range out {
			other -= v
		}
		out[otherKey] = max(other, 0)
	}
	return out
}

// childrenOf lists the pids whose parent is ppid.
func childrenOf(ppid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, _, pp, err := procTimes(pid); err == nil && pp == ppid {
			out = append(out, pid)
		}
	}
	return out
}

// postmasterPid is the parent of our own backend, when Postgres runs on this
// machine in our pid namespace (0 otherwise).
func postmasterPid(ctx context.Context, dbURL string) int {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0
	}
	_, _, ppid, err := procTimes(backend)
	if err != nil || !isComm(ppid, "postgres") {
		return 0
	}
	return ppid
}

// isComm says whether pid's command name contains name.
func isComm(pid int, name string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.Contains(string(b), name)
}
