package main

import "testing"

func TestScannedPartitions(t *testing.T) {
	for _, tc := range []struct {
		name string
		plan []string
		want string
	}{
		{"ordered append stops at the newest month", []string{
			"Limit (actual rows=26 loops=1)",
			"  ->  Append (actual rows=26 loops=1)",
			"        ->  Index Scan using ledger_entries_p202611_customer_id_created_at_id_idx on ledger_entries_p202611 ledger_entries_1 (actual rows=26 loops=1)",
			"        ->  Index Scan using ledger_entries_p202610_customer_id_created_at_id_idx on ledger_entries_p202610 ledger_entries_2 (never executed)",
		}, "1: p202611"},
		{"bitmap scans name each partition once", []string{
			"HashAggregate (actual rows=3 loops=1)",
			"  ->  Bitmap Heap Scan on ledger_entries_p202611 ledger_entries (actual rows=2970 loops=1)",
			"        ->  Bitmap Index Scan on ledger_entries_p202611_overage_idx (actual rows=2970 loops=1)",
		}, "1: p202611"},
		{"no ledger node", []string{"Result (actual rows=1 loops=1)"}, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := scannedPartitions(tc.plan); got != tc.want {
				t.Fatalf("scannedPartitions = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLedgerScaleGoalRows(t *testing.T) {
	base := func(ratio, detach, drop float64) *LedgerScaleResult {
		return &LedgerScaleResult{Months: 6, OneMonthRows: 1, AllMonthsRows: 6,
			Reads: []LedgerScaleRead{{Name: "history", Ratio: 1.01}, {Name: "overage", Ratio: ratio}},
			Drop:  &LedgerScaleDrop{DetachMs: detach, DropMs: drop}}
	}
	for _, tc := range []struct {
		name              string
		res               *LedgerScaleResult
		readsMet, dropMet bool
	}{
		{"within slack, fast drop", base(1.09, 2, 5), true, true},
		{"a read past the slack", base(1.2, 2, 5), false, true},
		{"a slow drop", base(1.0, 40, 3424), true, false},
		{"failed run", &LedgerScaleResult{Error: "boom"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, readsMet, _, dropMet := ledgerScaleGoalRows(tc.res)
			if *readsMet != tc.readsMet || *dropMet != tc.dropMet {
				t.Fatalf("met = %v/%v, want %v/%v", *readsMet, *dropMet, tc.readsMet, tc.dropMet)
			}
		})
	}
}
