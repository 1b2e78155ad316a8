package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func lines(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestLoggerBatchesInfo: informational lines wait; a warning is written at once, after them, in
// order; what is left is written by the flush function.
func TestLoggerBatchesInfo(t *testing.T) {
	out := &syncBuffer{}
	log, flush := newLogger(out, slog.LevelInfo, time.Hour)
	log.Info("request", slog.Int("n", 1))
	log.With(slog.String("component", "x")).Info("request", slog.Int("n", 2))
	log.Debug("not logged")
	if got := out.String(); got != "" {
		t.Fatalf("informational lines written at once: %q", got)
	}
	log.With(slog.String("component", "x")).Warn("backend stream broke")
	got := lines(out.String())
	if len(got) != 3 || !strings.Contains(got[0], `"n":1`) || !strings.Contains(got[1], `"n":2`) || !strings.Contains(got[2], "backend stream broke") {
		t.Fatalf("after a warning: %q", got)
	}
	for _, l := range got {
		if !json.Valid([]byte(l)) {
			t.Errorf("not a JSON line: %s", l)
		}
	}
	log.Info("request", slog.Int("n", 3))
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	if got := lines(out.String()); len(got) != 4 || !strings.Contains(got[3], `"n":3`) {
		t.Fatalf("after flush: %q", got)
	}
}

// TestLoggerFlushesOnItsOwn: informational lines are written without a warning or a flush, once
// they have waited, or once enough of them wait.
func TestLoggerFlushesOnItsOwn(t *testing.T) {
	out := &syncBuffer{}
	log, _ := newLogger(out, slog.LevelInfo, 20*time.Millisecond)
	log.Info("request", slog.Int("n", 1))
	for deadline := time.Now().Add(5 * time.Second); out.String() == ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("an informational line was never written")
		}
	}

	out = &syncBuffer{}
	log, _ = newLogger(out, slog.LevelInfo, time.Hour)
	long := strings.Repeat("x", 1000)
	for i := 0; out.String() == ""; i++ {
		if i*len(long) > 2*logBufferSize {
			t.Fatalf("%d lines of %d bytes held", i, len(long))
		}
		log.Info("request", slog.String("pad", long))
	}
}

// TestUnsolicitedBytesAreNotLogged: a backend that follows its answer with another one makes
// net/http's Transport log the bytes it did not ask for; through stdLog the line is a warning
// that holds none of them.
func TestUnsolicitedBytesAreNotLogged(t *testing.T) {
	const secret = "another organization's completion"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = bufio.NewReader(c).ReadString('\n') // the request line is enough
		reply := func(body string) string {
			return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
		_, _ = io.WriteString(c, reply("{}")+reply(secret))
		time.Sleep(5 * time.Second)
	}()
	out := &syncBuffer{}
	prevOut, prevFlags := stdlog.Writer(), stdlog.Flags()
	stdlog.SetFlags(0)
	stdlog.SetOutput(stdLog{slog.New(slog.NewJSONHandler(out, nil))})
	defer func() { stdlog.SetOutput(prevOut); stdlog.SetFlags(prevFlags) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(out.String(), unsolicited); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the Transport logged no unsolicited response: %q", out.String())
		}
	}
	var line struct{ Level, Msg string }
	if err := json.Unmarshal([]byte(lines(out.String())[0]), &line); err != nil || line.Level != "WARN" {
		t.Errorf("line %q (%v), want a JSON warning", out.String(), err)
	}
	if strings.Contains(out.String(), "organization") {
		t.Errorf("the log holds the unsolicited bytes: %s", out.String())
	}
}

// failingOnce fails its first write, as stderr may.
type failingOnce struct {
	syncBuffer
	failed bool
}

func (f *failingOnce) Write(p []byte) (int, error) {
	if !f.failed {
		f.failed = true
		return 0, io.ErrShortWrite
	}
	return f.syncBuffer.Write(p)
}

// TestLoggerWritesAgainAfterAFailedWrite: a write to the log's output that fails loses the lines
// it held, not every line after it.
func TestLoggerWritesAgainAfterAFailedWrite(t *testing.T) {
	out := &failingOnce{}
	log, flush := newLogger(out, slog.LevelInfo, time.Hour)
	log.Warn("lost")
	log.Warn("written")
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "written") || strings.Contains(got, "lost") {
		t.Fatalf("after a failed write the log holds %q, want only the later line", got)
	}
}
