package persist

import (
	"context"
	"sort"
	"strings"
	"testing"
)

// partitionView is what a plan test needs to read a plan of the
// month-partitioned tables (migrations 033, 034 and 035) as it
// read the plan of one table: which partition index stands for which index of the parent, and
// which partitions are empty (a Seq Scan of one reads nothing, whatever
// the ledger's size).
type partitionView struct {
	parentIndex map[string]string // partition's index -> the parent's
	empty       map[string]bool   // partitions without a row
}

// readPartitions reads the view from q's database; call it after the
// test's rows are written.
func readPartitions(t *testing.T, ctx context.Context, q querier) partitionView {
	t.Helper()
	v := partitionView{parentIndex: map[string]string{}, empty: map[string]bool{}}
	rows, err := q.Query(ctx, `SELECT c.relname, p.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE c.relkind = 'i' AND c.relnamespace = current_schema()::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var child, parent string
		if err := rows.Scan(&child, &parent); err != nil {
			t.Fatal(err)
		}
		v.parentIndex[child] = parent
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = q.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent IN ('ledger_entries'::regclass, 'operations'::regclass, 'webhook_events'::regclass,
			'webhook_deliveries'::regclass)`)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		r, err := q.Query(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+p+`)`)
		if err != nil {
			t.Fatal(err)
		}
		var empty bool
		for r.Next() {
			if err := r.Scan(&empty); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		v.empty[p] = empty
	}
	return v
}

// index names the parent index a plan's index stands for (itself when
// it is not a partition's).
func (v partitionView) index(name string) string {
	if p, ok := v.parentIndex[name]; ok {
		return p
	}
	return name
}

// text rewrites a text plan: each partition index under its parent's name,
// and without the Seq Scans of empty partitions.
func (v partitionView) text(plan string) string {
	children := make([]string, 0, len(v.parentIndex))
	for c := range v.parentIndex {
		children = append(children, c)
	}
	// Longest first: a name may start with another.
	sort.Slice(children, func(i, j int) bool { return len(children[i]) > len(children[j]) })
	for _, c := range children {
		plan = strings.ReplaceAll(plan, c, v.parentIndex[c])
	}
	var out []string
	for _, line := range strings.Split(plan, "\n") {
		skip := false
		for p, empty := range v.empty {
			if empty && strings.Contains(line, "Seq Scan on "+p+" ") {
				skip = true
			}
		}
		if !skip {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// emptyScan reports whether n is a Seq Scan of an empty partition.
func (v partitionView) emptyScan(n planNode) bool {
	return n.NodeType == "Seq Scan" && v.empty[n.RelationName]
}
