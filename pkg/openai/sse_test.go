package openai

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the decoder's output")

// readers wraps an input the ways a network delivers it.
var readers = []struct {
	name string
	wrap func(io.Reader) io.Reader
}{
	{"whole", func(r io.Reader) io.Reader { return r }},
	{"one byte", iotest.OneByteReader},
	{"half", iotest.HalfReader},
	{"data with EOF", iotest.DataErrReader},
}

// show renders an event for comparison; nil and empty data differ.
func show(ev Event) string {
	switch {
	case ev.Comment && ev.Data == nil && ev.Name == "":
		return "comment"
	case ev.Data == nil:
		return fmt.Sprintf("event %q comment=%v data=nil", ev.Name, ev.Comment)
	case ev.Comment:
		return fmt.Sprintf("event %q comment=true data=%q", ev.Name, ev.Data)
	default:
		return fmt.Sprintf("event %q data=%q", ev.Name, ev.Data)
	}
}

// decodeAll returns the rendered events up to the first error, and that error.
func decodeAll(d *Decoder) ([]string, error) {
	var got []string
	for {
		ev, err := d.Next()
		if err != nil {
			return got, err
		}
		got = append(got, show(ev))
	}
}

func data(s string) string { return show(Event{Data: []byte(s)}) }

func TestDecoder(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		want      []string
		truncated bool
	}{
		{name: "empty input"},
		{name: "only blank lines", in: "\n\r\n\r"},
		{name: "one event", in: "data: hello\n\n", want: []string{data("hello")}},
		{name: "no space after colon", in: "data:hello\n\n", want: []string{data("hello")}},
		{name: "only one space is removed", in: "data:  hello \n\n", want: []string{data(" hello ")}},
		{name: "colons in the value", in: "data: {\"a\":\"b:c\"}\n\n", want: []string{data(`{"a":"b:c"}`)}},
		{name: "lines joined with LF", in: "data: a\ndata: b\ndata:\ndata: c\n\n", want: []string{data("a\nb\n\nc")}},
		{name: "CRLF", in: "data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n", want: []string{data("a\nb"), data("c")}},
		{name: "CR", in: "data: a\rdata: b\r\rdata: c\r\r", want: []string{data("a\nb"), data("c")}},
		{name: "mixed line ends", in: "data: a\r\n\ndata: b\r\r\ndata: c\n\r", want: []string{data("a"), data("b"), data("c")}},
		{name: "empty data is an event", in: "data:\n\ndata\n\n", want: []string{data(""), data("")}},
		{name: "two empty data lines", in: "data\ndata\n\n", want: []string{data("\n")}},
		{name: "event name", in: "event: usage\ndata: x\n\ndata: y\n\n", want: []string{show(Event{Name: "usage", Data: []byte("x")}), data("y")}},
		{name: "last event name wins", in: "event: a\nevent: b\ndata: x\n\n", want: []string{show(Event{Name: "b", Data: []byte("x")})}},
		{name: "keepalive", in: ": keepalive\n\n", want: []string{"comment"}},
		{name: "bare colon comment", in: ":\n\n", want: []string{"comment"}},
		{name: "comments between events", in: "data: a\n\n: ping\n\n: ping\n\ndata: b\n\n", want: []string{data("a"), "comment", "comment", data("b")}},
		{name: "comment inside an event", in: ": note\ndata: a\n: more\n\n", want: []string{data("a")}},
		{name: "id, retry and unknown fields ignored", in: "id: 7\nretry: 3000\nfoo: bar\nfoo\ndata: x\n\n", want: []string{data("x")}},
		{name: "block without data or comments skipped", in: "id: 5\n\nevent: x\n\ndata: y\n\n", want: []string{data("y")}},
		{name: "field names are exact", in: "Data: a\ndata : b\n data: c\n\n", want: nil},
		{name: "byte-order mark at start", in: "\xef\xbb\xbfdata: x\n\n", want: []string{data("x")}},
		{name: "byte-order mark only at start", in: "data: x\n\n\xef\xbb\xbfdata: y\n\n", want: []string{data("x")}},
		{name: "partial byte-order mark is text", in: "\xef\xbbdata: x\n\n", want: nil},
		{name: "blank lines before the first event", in: "\n\n\ndata: x\n\n", want: []string{data("x")}},
		{name: "done", in: "data: {}\n\ndata: [DONE]\n\n", want: []string{data("{}"), data("[DONE]")}},
		{name: "ends after CR blank line", in: "data: x\r\r", want: []string{data("x")}},
		{name: "no final line end", in: "data: x", want: []string{data("x")}, truncated: true},
		{name: "no final blank line", in: "data: a\n\ndata: [DONE]\n", want: []string{data("a"), data("[DONE]")}, truncated: true},
		{name: "no final blank line after CR", in: "data: a\r", want: []string{data("a")}, truncated: true},
		{name: "unterminated multi-line event", in: "data: a\n\ndata: b\ndata: c", want: []string{data("a"), data("b\nc")}, truncated: true},
		{name: "unterminated comment", in: "data: a\n\n: keep", want: []string{data("a")}, truncated: true},
		{name: "unterminated fields without data", in: "event: x\nid: 1\n", truncated: true},
	}
	for _, tc := range tests {
		for _, rd := range readers {
			t.Run(tc.name+"/"+rd.name, func(t *testing.T) {
				d := NewDecoder(rd.wrap(strings.NewReader(tc.in)))
				got, err := decodeAll(d)
				if err != io.EOF {
					t.Fatalf("err = %v, want io.EOF", err)
				}
				if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
				if d.Truncated() != tc.truncated {
					t.Errorf("Truncated = %v, want %v", d.Truncated(), tc.truncated)
				}
				if _, err := d.Next(); err != io.EOF {
					t.Errorf("after the end, err = %v, want io.EOF again", err)
				}
			})
		}
	}
}

func TestDecoderReadError(t *testing.T) {
	boom := errors.New("connection reset")
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			r := io.MultiReader(rd.wrap(strings.NewReader("data: a\n\ndata: b\n")), iotest.ErrReader(boom))
			d := NewDecoder(r)
			got, err := decodeAll(d)
			if err != boom {
				t.Fatalf("err = %v, want the reader's own error", err)
			}
			if strings.Join(got, "\n") != data("a") {
				t.Errorf("got %q; an event interrupted by an error must not be returned", got)
			}
			if _, err := d.Next(); err != boom {
				t.Errorf("second call: err = %v, want the same error", err)
			}
		})
	}
	t.Run("error on the first read", func(t *testing.T) {
		if _, err := NewDecoder(iotest.ErrReader(boom)).Next(); err != boom {
			t.Errorf("err = %v", err)
		}
	})
}

func TestDecoderEventSize(t *testing.T) {
	big := strings.Repeat("x", 200<<10) // longer than the read buffer
	tests := []struct {
		name     string
		in       string
		maxEvent int
		want     []string
		tooLarge bool
	}{
		{name: "at the limit", in: "data: 0123456\n\n", maxEvent: 15, want: []string{data("0123456")}},
		{name: "one byte over", in: "data: 01234567\n\n", maxEvent: 15, tooLarge: true},
		{name: "CRLF counts as one byte", in: "data: 0123456\r\n\r\n", maxEvent: 15, want: []string{data("0123456")}},
		{name: "the limit is per event", in: strings.Repeat("data: 0123456\n\n", 20), maxEvent: 15, want: slicesRepeat(data("0123456"), 20)},
		{name: "many lines", in: strings.Repeat("data: 0\n", 10) + "\n", maxEvent: 50, tooLarge: true},
		{name: "comments count", in: ": " + strings.Repeat("c", 100) + "\n\n", maxEvent: 50, tooLarge: true},
		{name: "one line longer than the limit", in: "data: " + big + "\n\n", maxEvent: 100 << 10, tooLarge: true},
		{name: "one line longer than the buffer", in: "data: " + big + "\n\ndata: y\n\n", maxEvent: 0, want: []string{data(big), data("y")}},
		{name: "unterminated line over the limit", in: "data: " + big, maxEvent: 100 << 10, tooLarge: true},
	}
	for _, tc := range tests {
		for _, rd := range readers {
			t.Run(tc.name+"/"+rd.name, func(t *testing.T) {
				d := NewDecoderSize(rd.wrap(strings.NewReader(tc.in)), tc.maxEvent)
				got, err := decodeAll(d)
				if tc.tooLarge {
					if !errors.Is(err, ErrEventTooLarge) {
						t.Fatalf("err = %v, want ErrEventTooLarge", err)
					}
					if _, again := d.Next(); again != err {
						t.Errorf("second call: err = %v", again)
					}
					return
				}
				if err != io.EOF {
					t.Fatalf("err = %v", err)
				}
				if len(got) != len(tc.want) || strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("got %d events, want %d", len(got), len(tc.want))
				}
			})
		}
	}
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestDecoderDoesNotWait checks that an event is returned as soon as its blank line arrives, even
// when that line ends in a lone CR and the next byte could be its LF.
func TestDecoderDoesNotWait(t *testing.T) {
	for _, in := range []string{"data: a\n\n", "data: a\r\n\r\n", "data: a\r\r", ": keepalive\n\n"} {
		t.Run(strconv.Quote(in), func(t *testing.T) {
			pr, pw := io.Pipe()
			defer pw.Close()
			go func() { _, _ = pw.Write([]byte(in)) }()
			type result struct {
				ev  Event
				err error
			}
			done := make(chan result, 1)
			go func() {
				ev, err := NewDecoder(pr).Next()
				done <- result{ev, err}
			}()
			select {
			case r := <-done:
				if r.err != nil || (string(r.ev.Data) != "a" && !r.ev.Comment) {
					t.Errorf("got %s, %v", show(r.ev), r.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Next waited for more input than the event needed")
			}
		})
	}
}

func TestAppendData(t *testing.T) {
	tests := []struct {
		data string
		want string
	}{
		{"", "data: \n\n"},
		{"[DONE]", "data: [DONE]\n\n"},
		{`{"a":1}`, "data: {\"a\":1}\n\n"},
		{"a\nb", "data: a\ndata: b\n\n"},
		{"a\r\nb", "data: a\ndata: b\n\n"},
		{"a\rb", "data: a\ndata: b\n\n"},
		{"a\n", "data: a\ndata: \n\n"},
		{"\n", "data: \ndata: \n\n"},
		{"a\r\r\nb", "data: a\ndata: \ndata: b\n\n"},
		{" lead", "data:  lead\n\n"},
	}
	for _, tc := range tests {
		t.Run(strconv.Quote(tc.data), func(t *testing.T) {
			if got := AppendData([]byte("x"), []byte(tc.data)); string(got) != "x"+tc.want {
				t.Errorf("got %q, want %q", got, "x"+tc.want)
			}
		})
	}
}

// normalizeLineEnds turns CRLF and CR into LF, as a decoder sees them.
func normalizeLineEnds(s []byte) []byte {
	s = bytes.ReplaceAll(s, []byte("\r\n"), []byte("\n"))
	return bytes.ReplaceAll(s, []byte("\r"), []byte("\n"))
}

func TestAppendDataRoundTrip(t *testing.T) {
	datas := []string{"", "x", "[DONE]", chunk, "a\nb", "a\r\nb\rc\n", "\n\n", " spaced ", ": not a comment", "data: nested", "\xef\xbb\xbfbom", "\x00\xff", strings.Repeat("long ", 20000)}
	var stream []byte
	stream = append(stream, Keepalive...)
	for _, s := range datas {
		stream = AppendData(stream, []byte(s))
		stream = append(stream, Keepalive...)
	}
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			d := NewDecoder(rd.wrap(bytes.NewReader(stream)))
			for _, s := range datas {
				if ev, err := d.Next(); err != nil || !ev.Comment {
					t.Fatalf("want the keepalive, got %s, %v", show(ev), err)
				}
				ev, err := d.Next()
				if err != nil {
					t.Fatal(err)
				}
				if want := normalizeLineEnds([]byte(s)); !bytes.Equal(ev.Data, want) || ev.Comment || ev.Name != "" {
					t.Errorf("got %.80s, want data %.80q", show(ev), want)
				}
			}
			if ev, err := d.Next(); err != nil || !ev.Comment {
				t.Fatalf("want the keepalive, got %s, %v", show(ev), err)
			}
			if _, err := d.Next(); err != io.EOF || d.Truncated() {
				t.Errorf("end: %v, truncated %v", err, d.Truncated())
			}
		})
	}
}

func TestIsDone(t *testing.T) {
	tests := []struct {
		data string
		want bool
	}{
		{"[DONE]", true},
		{" [DONE] ", true},
		{"[DONE]\n", true},
		{"[done]", false},
		{"[DONE]]", false},
		{`"[DONE]"`, false},
		{"", false},
	}
	for _, tc := range tests {
		if got := IsDone([]byte(tc.data)); got != tc.want {
			t.Errorf("IsDone(%q) = %v", tc.data, got)
		}
	}
}

func TestKeepaliveIsAComment(t *testing.T) {
	ev, err := NewDecoder(bytes.NewReader(Keepalive)).Next()
	if err != nil || !ev.Comment || ev.Data != nil {
		t.Errorf("got %s, %v", show(ev), err)
	}
}

// TestRecordedStreams decodes streams shaped like real model servers' and compares the events with
// testdata/<name>.golden (go test -run TestRecordedStreams -update rewrites them).
func TestRecordedStreams(t *testing.T) {
	tests := []struct {
		file      string
		usage     Usage
		usageAt   string // "choices" if usage rides on a chunk with choices, "empty" if on its own chunk
		comments  int
		truncated bool
	}{
		{file: "vllm-chat-usage.sse", usage: Usage{PromptTokens: 9, CompletionTokens: 12, TotalTokens: 21}, usageAt: "choices"},
		{file: "crlf.sse", usage: Usage{PromptTokens: 5, CompletionTokens: 7, TotalTokens: 12, PromptTokensDetails: PromptTokensDetails{CachedTokens: 3}}, usageAt: "empty"},
		{file: "keepalive.sse", usage: Usage{PromptTokens: 9, CompletionTokens: 12, TotalTokens: 21}, usageAt: "empty", comments: 3},
		{file: "no-final-blank-line.sse", truncated: true},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var want []byte
			for i, rd := range readers {
				d := NewDecoder(rd.wrap(bytes.NewReader(in)))
				var summary bytes.Buffer
				var usage Usage
				var usageAt string
				comments, done := 0, false
				var fields []Field
				for {
					ev, err := d.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					fmt.Fprintln(&summary, show(ev))
					switch {
					case ev.Comment:
						comments++
						continue
					case done:
						t.Errorf("event after [DONE]: %s", show(ev))
					case IsDone(ev.Data):
						done = true
						continue
					}
					if fields, err = parseObject(fields, ev.Data); err != nil {
						t.Fatalf("chunk: %v", err)
					}
					u, ok := Lookup(ev.Data, fields, "usage")
					if !ok {
						continue
					}
					if parsed, ok, err := ParseUsage(u.Value(ev.Data)); err != nil {
						t.Fatal(err)
					} else if ok {
						usage = parsed
						var c ChatCompletionChunk
						if err := Decode(ev.Data, &c); err != nil {
							t.Fatal(err)
						}
						usageAt = map[bool]string{true: "empty", false: "choices"}[len(c.Choices) == 0]
					}
				}
				fmt.Fprintf(&summary, "truncated: %v\n", d.Truncated())
				if !done {
					t.Errorf("%s: no [DONE]", rd.name)
				}
				if usage != tc.usage || usageAt != tc.usageAt || comments != tc.comments || d.Truncated() != tc.truncated {
					t.Errorf("%s: usage %+v on %q, %d comments, truncated %v", rd.name, usage, usageAt, comments, d.Truncated())
				}
				if i == 0 {
					want = summary.Bytes()
				} else if !bytes.Equal(summary.Bytes(), want) {
					t.Errorf("%s reader decoded differently:\n%s", rd.name, summary.Bytes())
				}
			}
			golden := filepath.Join("testdata", strings.TrimSuffix(tc.file, ".sse")+".golden")
			if *update {
				if err := os.WriteFile(golden, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			g, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(g, want) {
				t.Errorf("decoded\n%s\nwant (%s)\n%s", want, golden, g)
			}
		})
	}
}

func TestDecoderDoesNotAllocate(t *testing.T) {
	d := NewDecoder(&repeatReader{data: AppendData(nil, []byte(chunk))})
	for range 10 { // let the buffers grow
		if _, err := d.Next(); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if ev, err := d.Next(); err != nil || len(ev.Data) != len(chunk) {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per event", allocs)
	}
}

// repeatReader reads data over and over, in reads of at most 4 KiB like a network connection.
type repeatReader struct {
	data []byte
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && n < 4096 {
		c := copy(p[n:min(len(p), 4096)], r.data[r.off:])
		n += c
		r.off = (r.off + c) % len(r.data)
	}
	return n, nil
}

func BenchmarkDecoder(b *testing.B) {
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"chunk", AppendData(nil, []byte(chunk))},
		{"named", append([]byte("event: content_block_delta\n"), AppendData(nil, []byte(chunk))...)},
		{"multi-line", AppendData(nil, []byte(strings.ReplaceAll(chunk, ",", ",\n")))},
		{"CRLF", bytes.ReplaceAll(AppendData(nil, []byte(chunk)), []byte("\n"), []byte("\r\n"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			d := NewDecoder(&repeatReader{data: bc.data})
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Next(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppendData(b *testing.B) {
	data := []byte(chunk)
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendData(dst[:0], data)
	}
}

// TestDecoderDropsLargeBuffers checks that the buffers of an unusually large event are not kept for
// the rest of the stream.
func TestDecoderDropsLargeBuffers(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	d := NewDecoder(iotest.HalfReader(strings.NewReader("data: " + big + "\n\ndata: small\n\n")))
	if ev, err := d.Next(); err != nil || len(ev.Data) != len(big) {
		t.Fatalf("%d bytes, %v", len(ev.Data), err)
	}
	if ev, err := d.Next(); err != nil || string(ev.Data) != "small" {
		t.Fatalf("%q, %v", ev.Data, err)
	}
	if cap(d.data) > retained || cap(d.line) > retained {
		t.Errorf("after a 1 MiB event: %d bytes of data and %d of line kept", cap(d.data), cap(d.line))
	}
}
