package main

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	for _, v := range []int64{0, 1, 127, 128, 129, 255, 256, 1000, 999_999, 1 << 40, 1<<62 + 12345} {
		i := index(v)
		if lo := lowerBound(i); lo > v {
			t.Fatalf("v=%d: bucket %d starts at %d", v, i, lo)
		}
		if i+1 < histBuckets {
			if hi := lowerBound(i + 1); hi <= v {
				t.Fatalf("v=%d: bucket %d ends at %d", v, i, hi)
			}
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	tests := []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		{"uniform 0-10ms", func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(10 * time.Millisecond))) }},
		{"exponential 200us", func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * 200e3) }},
		{"tiny", func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(300)) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var a, b Histogram
			vals := make([]int64, 0, 100_000)
			for i := 0; i < 100_000; i++ {
				d := tc.gen(r)
				vals = append(vals, int64(d))
				if i%2 == 0 {
					a.Record(d)
				} else {
					b.Record(d)
				}
			}
			a.Merge(&b)
			sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
			if a.Count() != uint64(len(vals)) || int64(a.Max()) != vals[len(vals)-1] {
				t.Fatalf("count %d max %d", a.Count(), a.Max())
			}
			for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
				want := float64(vals[int(q*float64(len(vals)))-1])
				got := float64(a.Quantile(q))
				if d := got - want; d > want/50+1 || -d > want/50+1 {
					t.Errorf("q%.3f: got %.0f want %.0f", q, got, want)
				}
			}
		})
	}
}
