package main

import (
	"context"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// machineBusy is the CPU seconds every CPU of the machine spent not idle,
// from /proc/stat; minus our processes it is the load of everything else.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	var total, idle float64
	for i, s := range f[1:] {
		v, _ := strconv.ParseFloat(s, 64)
		if i >= 8 { // guest time is already in user
			break
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return (total - idle) / clockTicks
}

// RedisCalls is one command's share of Redis work between two samples.
type RedisCalls struct {
	Command     string  `json:"command"`
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	CallsPerOp  float64 `json:"calls_per_op"`
	UsecPerCall float64 `json:"usec_per_call"`
}

// commandStats reads INFO commandstats as command -> (calls, usec).
func commandStats(ctx context.Context, rdb *redis.Client) map[string][2]int64 {
	s, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil
	}
	out := map[string][2]int64{}
	for _, line := range strings.Split(s, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var calls, usec int64
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = [2]int64{calls, usec}
	}
	return out
}

// redisDelta is the commands Redis ran between two samples (all clients:
// on a shared Redis this includes others' work), biggest first.
func redisDelta(before, after map[string][2]int64, ops float64) []RedisCalls {
	var out []RedisCalls
	for cmd, a := range after {
		b := before[cmd]
		calls, usec := a[0]-b[0], a[1]-b[1]
		if calls <= 0 {
			continue
		}
		rc := RedisCalls{Command: cmd, Calls: calls, Usec: usec, UsecPerCall: float64(usec) / float64(calls)}
		if ops > 0 {
			rc.CallsPerOp = float64(calls) / ops
		}
		out = append(out, rc)
	}
	sortBy(out, func(a, b RedisCalls) bool { return a.Usec > b.Usec })
	if len(out) > 8 {
		out = out[:8]
	}
	return out
}

// PGStats is the work Postgres did for the run's database.
type PGStats struct {
	Commits       int64   `json:"xact_commit"`
	Inserted      int64   `json:"tup_inserted"`
	Updated       int64   `json:"tup_updated"`
	Fetched       int64   `json:"tup_fetched"`
	CommitsPerOp  float64 `json:"commits_per_op"`
	InsertedPerOp float64 `json:"inserted_per_op"`
	UpdatedPerOp  float64 `json:"updated_per_op"`
	// Tables is pg_stat_user_tables by table: which tables an op writes and
	// reads through an index. pg_stat_statements would name the statements,
	// but it needs shared_preload_libraries, which a stock Postgres lacks.
	Tables []PGTable `json:"tables,omitempty"`
	tables map[string]PGTable
}

// PGTable is one table's row and index-scan counters (per op once
// subtracted).
type PGTable struct {
	Name     string  `json:"name"`
	Inserted float64 `json:"inserted"`
	Updated  float64 `json:"updated"`
	Deleted  float64 `json:"deleted"`
	IdxScans float64 `json:"idx_scans"`
}

func pgStats(ctx context.Context, conn *pgx.Conn) PGStats {
	var s PGStats
	if conn == nil {
		return s
	}
	_ = conn.QueryRow(ctx, `SELECT xact_commit, tup_inserted, tup_updated, tup_fetched
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.Commits, &s.Inserted, &s.Updated, &s.Fetched)
	rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, coalesce(idx_scan, 0) FROM pg_stat_user_tables`)
	if err != nil {
		return s
	}
	defer rows.Close()
	s.tables = map[string]PGTable{}
	for rows.Next() {
		var t PGTable
		var ins, upd, del, idx int64
		if rows.Scan(&t.Name, &ins, &upd, &del, &idx) == nil {
			t.Inserted, t.Updated, t.Deleted, t.IdxScans = float64(ins), float64(upd), float64(del), float64(idx)
			s.tables[t.Name] = t
		}
	}
	return s
}

func (s PGStats) sub(b PGStats, ops float64) PGStats {
	d := PGStats{Commits: s.Commits - b.Commits, Inserted: s.Inserted - b.Inserted, Updated: s.Updated - b.Updated, Fetched: s.Fetched - b.Fetched}
	if ops > 0 {
		d.CommitsPerOp, d.InsertedPerOp, d.UpdatedPerOp = float64(d.Commits)/ops, float64(d.Inserted)/ops, float64(d.Updated)/ops
		for name, t := range s.tables {
			p := b.tables[name]
			x := PGTable{Name: name, Inserted: (t.Inserted - p.Inserted) / ops, Updated: (t.Updated - p.Updated) / ops,
				Deleted: (t.Deleted - p.Deleted) / ops, IdxScans: (t.IdxScans - p.IdxScans) / ops}
			if x.Inserted+x.Updated+x.Deleted+x.IdxScans >= 0.01 {
				d.Tables = append(d.Tables, x)
			}
		}
		sortBy(d.Tables, func(x, y PGTable) bool {
			return x.Inserted+x.Updated+x.Deleted+x.IdxScans > y.Inserted+y.Updated+y.Deleted+y.IdxScans
		})
	}
	return d
}

func sortBy[T any](s []T, less func(a, b T) bool) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && less(s[j], s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
