package engine

import "testing"

// TestSweepOrder: a pass visits every partition exactly once, in a
// rotation, and the rotation's start varies between passes (so fleet nodes
// spread over the partitions instead of all sweeping partition 0 first).
func TestSweepOrder(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 2, 32} {
		starts := map[int]bool{}
		for range 200 {
			var got []int
			for p := range sweepOrder(n) {
				got = append(got, p)
			}
			if len(got) != n {
				t.Fatalf("n=%d: %d partitions visited", n, len(got))
			}
			seen := map[int]bool{}
			for i, p := range got {
				if p < 0 || p >= n || seen[p] {
					t.Fatalf("n=%d: order %v", n, got)
				}
				seen[p] = true
				if i > 0 && p != (got[i-1]+1)%n {
					t.Fatalf("n=%d: order %v is not a rotation", n, got)
				}
			}
			if n > 0 {
				starts[got[0]] = true
			}
		}
		if n >= 2 && len(starts) < 2 {
			t.Errorf("n=%d: every pass started at %v", n, starts)
		}
	}
}
