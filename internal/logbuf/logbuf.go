// Package logbuf batches creditd's log lines into fewer writes: at the
// default level every request writes an access log line, and one write
// syscall per line was a measurable share of a consume's CPU (issue 26).
// Lines at info and below wait in a buffer for at most FlushAfter or
// FlushBytes, whichever comes first; a line at warn or above is written at
// once, together with every line before it, so order holds and what an
// operator must see is never late. Close writes what is left.
package logbuf

import (
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Limits of the buffer: a line waits at most FlushAfter, and the buffer is
// written once it holds FlushBytes (a line longer than that goes out at
// once, whole).
const (
	FlushAfter = 100 * time.Millisecond
	FlushBytes = 32 << 10
)

// Writer is a zerolog.LevelWriter over out that batches lines; safe for
// concurrent use. Each Write is one whole line (zerolog writes an event in
// one call), so lines are never split across writes to out.
type Writer struct {
	mu     sync.Mutex
	out    io.Writer
	buf    []byte
	timer  *time.Timer // armed while buf holds lines
	closed bool        // after Close every line is written at once
}

// New is a Writer over out.
func New(out io.Writer) *Writer {
	w := &Writer{out: out, buf: make([]byte, 0, FlushBytes)}
	w.timer = time.AfterFunc(time.Hour, func() { _ = w.Flush() })
	w.timer.Stop()
	return w
}

// Write buffers p, a line of no level (zerolog's NoLevel).
func (w *Writer) Write(p []byte) (int, error) {
	return w.WriteLevel(zerolog.NoLevel, p)
}

// WriteLevel implements zerolog.LevelWriter: a line at warn or above (and
// every line after Close) is written with what is buffered before it.
func (w *Writer) WriteLevel(level zerolog.Level, p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	urgent := w.closed || (level >= zerolog.WarnLevel && level != zerolog.NoLevel)
	if !urgent && len(w.buf)+len(p) <= FlushBytes {
		if len(w.buf) == 0 {
			w.timer.Reset(FlushAfter)
		}
		w.buf = append(w.buf, p...)
		return len(p), nil
	}
	if len(w.buf)+len(p) <= FlushBytes {
		// One write for the buffered lines and this one.
		w.buf = append(w.buf, p...)
		return len(p), w.flushLocked()
	}
	if err := w.flushLocked(); err != nil {
		return 0, err
	}
	return w.out.Write(p)
}

// Flush writes the buffered lines now.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushLocked()
}

func (w *Writer) flushLocked() error {
	w.timer.Stop()
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.out.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Close writes the buffered lines; lines written after it go out at once
// (a late goroutine's line is not lost). zerolog calls it before a Fatal
// event exits. It does not close out.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	return w.flushLocked()
}
