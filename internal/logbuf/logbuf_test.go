package logbuf

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// recorder is an io.Writer that keeps every write apart.
type recorder struct {
	mu     sync.Mutex
	writes []string
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, string(p))
	return len(p), nil
}

func (r *recorder) all() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.writes, ""), len(r.writes)
}

// TestLinesInOrderNoneLost: info lines are batched, a warn line goes out at
// once after them, and everything logged reaches out, in order, once.
func TestLinesInOrderNoneLost(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	w := New(rec)
	log := zerolog.New(w)
	for i := 0; i < 100; i++ {
		log.Info().Int("i", i).Msg("request")
	}
	if got, n := rec.all(); n != 0 || got != "" {
		t.Fatalf("info lines written before a flush: %d writes", n)
	}
	log.Warn().Msg("late")
	got, n := rec.all()
	if n != 1 {
		t.Fatalf("%d writes for 100 info lines and a warn, want 1", n)
	}
	var want bytes.Buffer
	ref := zerolog.New(&want)
	for i := 0; i < 100; i++ {
		ref.Info().Int("i", i).Msg("request")
	}
	ref.Warn().Msg("late")
	if got != want.String() {
		t.Fatalf("lines differ:\n%s\nwant\n%s", got, want.String())
	}
}

// TestFlushAfter: a lone info line is written within FlushAfter.
func TestFlushAfter(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	log := zerolog.New(New(rec))
	log.Info().Msg("one")
	deadline := time.Now().Add(10 * FlushAfter)
	for time.Now().Before(deadline) {
		if got, _ := rec.all(); got != "" {
			return
		}
		time.Sleep(FlushAfter / 10)
	}
	t.Fatal("an info line was not written within 10 x FlushAfter")
}

// TestFullBufferAndLongLines: lines never split, the buffer is written when
// full, a line longer than the buffer goes out whole, and Close writes the
// rest and then writes through.
func TestFullBufferAndLongLines(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	w := New(rec)
	line := strings.Repeat("x", 999) + "\n"
	var want strings.Builder
	for i := 0; i < 3*FlushBytes/len(line); i++ {
		_, _ = w.WriteLevel(zerolog.InfoLevel, []byte(line))
		want.WriteString(line)
	}
	long := strings.Repeat("y", 2*FlushBytes) + "\n"
	_, _ = w.WriteLevel(zerolog.InfoLevel, []byte(long))
	want.WriteString(long)
	_, _ = w.WriteLevel(zerolog.DebugLevel, []byte("tail\n"))
	want.WriteString("tail\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.WriteLevel(zerolog.InfoLevel, []byte("after close\n"))
	want.WriteString("after close\n")
	got, _ := rec.all()
	if got != want.String() {
		t.Fatalf("%d bytes written, want %d", len(got), want.Len())
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, wr := range rec.writes {
		if len(wr) > FlushBytes && wr != long {
			t.Errorf("write %d is %d bytes, over FlushBytes", i, len(wr))
		}
		if !strings.HasSuffix(wr, "\n") {
			t.Errorf("write %d splits a line", i)
		}
	}
}

// TestConcurrentWriters: lines from many goroutines all arrive whole.
func TestConcurrentWriters(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	w := New(rec)
	log := zerolog.New(w)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				log.Info().Str("g", fmt.Sprint(g)).Int("i", i).Msg("request")
			}
		}()
	}
	wg.Wait()
	_ = w.Close()
	got, _ := rec.all()
	if n := strings.Count(got, "\n"); n != 8*500 {
		t.Fatalf("%d lines, want %d", n, 8*500)
	}
}
