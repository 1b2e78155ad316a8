package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logFlushEvery is how long the local server's informational log lines may wait to be written.
const logFlushEvery = 100 * time.Millisecond

// logBufferSize is how many bytes of log lines are written at once when they come faster.
const logBufferSize = 32 << 10

// newLogger returns the local server's logger, JSON lines on w at level and above, and the
// function that writes what is left (call it before the process exits). Lines are written in
// batches: a line at Warn or above at once, with those before it; the others within every, or as
// soon as logBufferSize bytes wait. Under load that is a write system call every few hundred
// requests instead of one per request's line, which was 2 % of the server's CPU. The Lambda
// gateway writes every line at once: the runtime may freeze it as soon as a response ends.
func newLogger(w io.Writer, level slog.Level, every time.Duration) (*slog.Logger, func() error) {
	b := &lineBuffer{out: w, w: bufio.NewWriterSize(w, logBufferSize), every: every}
	b.timer = time.AfterFunc(every, func() { _ = b.Flush() })
	b.timer.Stop()
	h := slog.NewJSONHandler(b, &slog.HandlerOptions{Level: level})
	return slog.New(flushingHandler{h, b}), func() error {
		b.timer.Stop()
		return b.Flush()
	}
}

// lineBuffer holds written lines until Flush, which the timer calls every after the first line
// that found it empty.
type lineBuffer struct {
	mu    sync.Mutex
	out   io.Writer
	w     *bufio.Writer // on out
	timer *time.Timer
	every time.Duration
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.w.Buffered() == 0 {
		b.timer.Reset(b.every)
	}
	n, err := b.w.Write(p)
	b.failed(err)
	return n, err
}

// Flush writes the lines held.
func (b *lineBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.w.Flush()
	b.failed(err)
	return err
}

// failed starts the buffer over after a write to out failed, dropping the lines it held: a
// bufio.Writer keeps its error, and would write no line again.
func (b *lineBuffer) failed(err error) {
	if err != nil {
		b.w.Reset(b.out)
	}
}

// flushingHandler writes the lines held as soon as one at Warn or above is logged.
type flushingHandler struct {
	slog.Handler
	b *lineBuffer
}

func (h flushingHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		if ferr := h.b.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h flushingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushingHandler{h.Handler.WithAttrs(attrs), h.b}
}

func (h flushingHandler) WithGroup(name string) slog.Handler {
	return flushingHandler{h.Handler.WithGroup(name), h.b}
}

// unsolicited starts the line net/http's Transport logs when a backend sent bytes no request
// asked for, followed by up to a read buffer of those bytes.
const unsolicited = "Unsolicited response received on idle HTTP channel"

// stdLog is the standard library's log (the log package's default logger, which net/http writes
// to), turned into warnings of a structured logger. The Transport's unsolicited-response line
// quotes what the backend sent beyond an answer: another request's completion, which never
// reaches a log (CONTRACT.md §10). That line keeps its first words only.
type stdLog struct{ log *slog.Logger }

func (s stdLog) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	if i := strings.Index(msg, unsolicited); i >= 0 {
		msg = msg[:i+len(unsolicited)] + "; its bytes are not logged: they may be another request's answer"
	}
	s.log.Warn(msg)
	return len(p), nil
}
