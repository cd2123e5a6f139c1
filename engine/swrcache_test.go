package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestSWRCache: fresh entries are served; past expiry exactly one caller
// is told to refresh while the others keep the stale value; past the stale
// limit it is read through (its value kept as the last good copy) and a
// miss only past lastGoodLimit; a delete during a refresh keeps the refresh's old
// value out; a full cache starts over.
func TestSWRCache(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	c := newSWRCache[string, int](3)
	if _, st := c.get("a", t0, time.Second, 0); st != cacheMiss {
		t.Fatalf("empty: state %d", st)
	}
	c.put("a", 1, t0.Add(time.Second), c.generation(), 0)
	steps := []struct {
		at    time.Duration
		want  int
		state cacheState
	}{
		{0, 1, cacheFresh},
		{999 * time.Millisecond, 1, cacheFresh},
		{time.Second, 1, cacheRefresh},
		{1500 * time.Millisecond, 1, cacheFresh},
		{2 * time.Second, 1, cacheExpired},
		{time.Second + lastGoodLimit, 0, cacheMiss},
	}
	for _, s := range steps {
		v, st := c.get("a", t0.Add(s.at), time.Second, 0)
		if v != s.want || st != s.state {
			t.Errorf("at +%v: %d state %d, want %d state %d", s.at, v, st, s.want, s.state)
		}
	}
	c.refreshFailed("a", false)
	if _, st := c.get("a", t0.Add(1500*time.Millisecond), time.Second, 0); st != cacheRefresh {
		t.Errorf("after a failed refresh: state %d, want another refresh", st)
	}
	gen := c.generation()
	c.delete("a")
	c.put("a", 2, t0.Add(time.Hour), gen, 0)
	if _, st := c.get("a", t0, time.Second, 0); st != cacheMiss {
		t.Error("a refresh begun before the delete stored its value")
	}
	for i, k := range []string{"a", "b", "c"} {
		c.put(k, i, t0.Add(time.Hour), c.generation(), 0)
	}
	c.deleteWhere(func(_ string, v int) bool { return v == 1 })
	if _, st := c.get("b", t0, time.Second, 0); st != cacheMiss {
		t.Error("deleteWhere kept b")
	}
	c.put("b", 5, t0.Add(time.Hour), c.generation(), 0)
	c.put("d", 6, t0.Add(time.Hour), c.generation(), 0)
	if _, st := c.get("a", t0, time.Second, 0); st != cacheMiss {
		t.Error("a full cache did not start over")
	}
	if v, st := c.get("d", t0, time.Second, 0); st != cacheFresh || v != 6 {
		t.Errorf("d after the start-over: %d state %d", v, st)
	}
}

// TestSWRCacheStamps: an entry is served only under the change stamp it
// was read under (issue 25): under another stamp it is cacheChanged (read
// through; its value only for a failed read) even while fresh, never a
// background refresh, and a miss past the stale limit as any entry.
func TestSWRCacheStamps(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		at    time.Duration
		stamp uint64
		want  cacheState
	}{
		{"same stamp, fresh", 0, 7, cacheFresh},
		{"same stamp, past expiry", 1500 * time.Millisecond, 7, cacheRefresh},
		{"newer stamp, fresh", 0, 8, cacheChanged},
		{"newer stamp, past expiry", 1500 * time.Millisecond, 8, cacheChanged},
		{"newer stamp, past the stale limit", 2 * time.Second, 8, cacheChanged},
		{"newer stamp, past the last-good limit", time.Second + lastGoodLimit, 8, cacheMiss},
		{"older stamp (a reset store)", 0, 6, cacheChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSWRCache[string, int](3)
			c.put("a", 1, t0.Add(time.Second), c.generation(), 7)
			if _, st := c.get("a", t0.Add(tc.at), time.Second, tc.stamp); st != tc.want {
				t.Errorf("state %d, want %d", st, tc.want)
			}
		})
	}
}

// TestSWRCacheLastGood (issue 26 item 3, invariant 16): an entry past its
// stale limit is read through (cacheExpired) until a read finds the source
// down; it is then served at once as the last good copy, one caller per
// lastGoodRetry refreshing it in the background, and never past
// lastGoodLimit; a value read afresh ends the down state.
func TestSWRCacheLastGood(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	c := newSWRCache[string, int](3)
	c.put("a", 1, t0.Add(time.Second), c.generation(), 0)
	past := t0.Add(time.Minute)
	if v, st := c.get("a", past, time.Second, 0); st != cacheExpired || v != 1 {
		t.Fatalf("past the stale limit: %d state %d, want the value, cacheExpired", v, st)
	}
	c.markDown("a", past)
	steps := []struct {
		name  string
		at    time.Time
		state cacheState
	}{
		{"right after the failure", past, cacheFresh},
		{"before lastGoodRetry", past.Add(lastGoodRetry - time.Millisecond), cacheFresh},
		{"at lastGoodRetry: one caller refreshes", past.Add(lastGoodRetry), cacheRefresh},
		{"while it refreshes", past.Add(lastGoodRetry), cacheFresh},
		{"past lastGoodLimit", t0.Add(time.Second + lastGoodLimit), cacheMiss},
	}
	for _, s := range steps {
		v, st := c.get("a", s.at, time.Second, 0)
		if st != s.state || (st != cacheMiss && v != 1) {
			t.Errorf("%s: %d state %d, want state %d", s.name, v, st, s.state)
		}
	}
	c.refreshFailed("a", false)
	if _, st := c.get("a", past.Add(2*lastGoodRetry), time.Second, 0); st != cacheRefresh {
		t.Errorf("after a refresh failed on something else: state %d, want another refresh", st)
	}
	c.put("a", 2, past.Add(time.Second), c.generation(), 0)
	if v, st := c.get("a", past.Add(time.Minute), time.Second, 0); st != cacheExpired || v != 2 {
		t.Errorf("a value read afresh is still down: %d state %d", v, st)
	}
	if _, st := c.get("a", past, time.Second, 7); st != cacheChanged {
		t.Errorf("another stamp while down: state %d, want cacheChanged (read through)", st)
	}
}

// TestSourceDown: what counts as the source being down.
func TestSourceDown(t *testing.T) {
	t.Parallel()
	pgDown := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	only := SourceDown(func(err error) bool { return errors.Is(err, pgDown) })
	for _, tc := range []struct {
		name string
		f    SourceDown
		err  error
		want bool
	}{
		{"nil error", nil, nil, false},
		{"not found", nil, ErrNotFound, false},
		{"not found, domain", nil, NotFound("no such customer"), false},
		{"cancelled", nil, context.Canceled, false},
		{"a domain answer", nil, Invalid("x", "bad"), false},
		{"record unavailable", only, fmt.Errorf("x: %w", ErrRecordUnavailable), true},
		{"default: any store failure", nil, errors.New("boom"), true},
		{"classifier says down", only, fmt.Errorf("persist: %w", pgDown), true},
		{"classifier says no", only, errors.New("syntax error"), false},
	} {
		if got := tc.f.says(tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
