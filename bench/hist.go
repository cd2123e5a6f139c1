package main

import (
	"math/bits"
	"time"
)

// Histogram is a log-bucketed latency histogram in the manner of HDR: values
// below 2^subBits nanoseconds are exact, above that each power of two is cut
// into 2^(subBits-1) linear sub-buckets, so a reported value is within 1/64
// (1.6 %) of the truth. Recording is an index computation and an add; it is
// not safe for concurrent use (each worker keeps its own and they are merged).
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	max    int64
	sum    float64
}

const (
	subBits     = 7                  // values below 2^7 ns are exact
	subCount    = 1 << (subBits - 1) // 64 sub-buckets per power of two
	histBuckets = 1<<subBits + 57*subCount
	exactLimit  = int64(1) << subBits
	subMask     = uint64(subCount) - 1
	halfSub     = uint64(subCount) // the top bit of a normalised value
)

// index is the bucket of v (ns, >= 0).
func index(v int64) int {
	if v < exactLimit {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	u := uint64(v)
	shift := bits.Len64(u) - subBits // >= 1
	return 1<<subBits + (shift-1)*subCount + int((u>>shift)&subMask)
}

// lowerBound is the smallest value of bucket i; upper is lowerBound of i+1.
func lowerBound(i int) int64 {
	if i < 1<<subBits {
		return int64(i)
	}
	j := i - 1<<subBits
	shift := j/subCount + 1
	sub := uint64(j%subCount) | halfSub
	return int64(sub << shift)
}

// Record adds one observation.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[index(v)]++
	h.n++
	h.sum += float64(v)
	if v > h.max {
		h.max = v
	}
}

// Merge adds o's observations to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.n }

// Max is the largest observation.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean is the average observation.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile is the value at quantile q (0..1): the midpoint of the bucket that
// holds the ceil(q*n)-th observation, never above Max.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.999999999)
	if rank < 1 {
		rank = 1
	}
	if rank > h.n {
		rank = h.n
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo := lowerBound(i)
			hi := lo + 1
			if i+1 < histBuckets {
				hi = lowerBound(i + 1)
			}
			mid := lo + (hi-lo-1)/2
			if mid > h.max {
				mid = h.max
			}
			return time.Duration(mid)
		}
	}
	return time.Duration(h.max)
}
