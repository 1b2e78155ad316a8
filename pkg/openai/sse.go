package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrEventTooLarge reports an event longer than the decoder's limit.
var ErrEventTooLarge = errors.New("server-sent event too large")

// Keepalive is the comment the gateway writes while a backend is silent.
var Keepalive = []byte(": keepalive\n\n")

// DefaultMaxEvent is how many bytes one event may have unless NewDecoderSize says otherwise.
const DefaultMaxEvent = 8 << 20

// readBuffer is the decoder's read buffer. Model servers' events are a few hundred bytes; a
// longer line is gathered across reads, so the buffer bounds only the memory of an idle stream.
const readBuffer = 4 << 10

// Decoder reads server-sent events as the WHATWG EventSource rules parse them: lines end in LF,
// CRLF or CR; "data:" lines accumulate; a blank line dispatches; a leading byte-order mark is
// skipped. Decoder does not wait for more input than an event needs, so each event is returned as
// soon as its blank line arrives.
type Decoder struct {
	r        *bufio.Reader
	maxEvent int

	started   bool // the byte-order mark check is done
	skipLF    bool // the last line ended in CR, so a leading LF belongs to it
	eof       bool // the input is exhausted
	truncated bool
	err       error // sticky
	readErr   error // from the byte-order mark check, to report once its bytes are consumed

	line []byte // a line that spans reads

	// The event being read. Data aliases data until the next call to Next.
	size    int // bytes of the event so far, line ends included
	lines   int // lines of the event so far
	data    []byte
	hasData bool
	comment bool
	name    string

	lastName string // the previous event's name
}

// NewDecoder returns a Decoder that reads from r through a 4 KiB buffer, with events of at most
// DefaultMaxEvent bytes.
func NewDecoder(r io.Reader) *Decoder { return NewDecoderSize(r, DefaultMaxEvent) }

// NewDecoderSize returns a Decoder whose events may have at most maxEvent bytes, counting each line
// end as one; a longer one is an error wrapping ErrEventTooLarge. maxEvent <= 0 means
// DefaultMaxEvent.
func NewDecoderSize(r io.Reader, maxEvent int) *Decoder {
	if maxEvent <= 0 {
		maxEvent = DefaultMaxEvent
	}
	return &Decoder{r: bufio.NewReaderSize(r, readBuffer), maxEvent: maxEvent}
}

// Pending reports whether the bytes already read hold the end of another event, so that Next
// will return without waiting for input. A relay flushes its output only when nothing is pending:
// a burst of events then costs one write to the client, and no event ever waits for a later one.
func (d *Decoder) Pending() bool {
	b, _ := d.r.Peek(d.r.Buffered())
	// A blank line is two line ends in a row: LF LF, LF CR (CR or CRLF after LF), or CR CR.
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r")) || bytes.Contains(b, []byte("\r\r"))
}

// Truncated reports whether the input ended inside an event rather than after the blank line that
// ends one. When that event had data, Next returned it before io.EOF.
func (d *Decoder) Truncated() bool { return d.truncated }

// Next returns the next event. A block of comment lines without data, such as a keepalive, is
// returned as an Event with Comment set; blocks with neither data nor comments are skipped, as
// EventSource skips them. At the end of the input Next returns io.EOF; if the input ended inside
// an event that had data, that event is returned first and Truncated reports true. Other read
// errors are returned as they are. After an error Next returns it again.
func (d *Decoder) Next() (Event, error) {
	if d.err != nil {
		return Event{}, d.err
	}
	d.reset()
	if !d.started {
		d.started = true
		b, err := d.r.Peek(3)
		if bytes.HasPrefix(b, []byte("\xef\xbb\xbf")) {
			_, _ = d.r.Discard(3)
		}
		d.readErr = err
	}
	for {
		if d.eof {
			return d.finish()
		}
		// Take what is buffered; read only when nothing is, so as not to hold back an event.
		n := d.r.Buffered()
		if n == 0 {
			err := d.readErr
			if err != nil {
				d.readErr = nil
			} else {
				_, err = d.r.Peek(1)
			}
			if err != nil {
				if err == io.EOF {
					d.eof = true
					continue
				}
				d.err = err
				return Event{}, err
			}
			n = d.r.Buffered()
		}
		b, _ := d.r.Peek(n)
		if d.skipLF {
			d.skipLF = false
			if b[0] == '\n' {
				_, _ = d.r.Discard(1)
				continue
			}
		}
		i := indexLineEnd(b)
		if i < 0 {
			if err := d.grow(len(b)); err != nil {
				return Event{}, err
			}
			d.line = append(d.line, b...)
			_, _ = d.r.Discard(len(b))
			continue
		}
		line := b[:i]
		if len(d.line) > 0 {
			d.line = append(d.line, line...)
			line = d.line
		}
		consumed := i + 1
		if b[i] == '\r' {
			if i+1 < len(b) {
				if b[i+1] == '\n' {
					consumed++
				}
			} else {
				d.skipLF = true
			}
		}
		// A line end counts as one byte, CRLF included, so that the limit does not depend on how
		// the input was split into reads.
		if err := d.grow(i + 1); err != nil {
			return Event{}, err
		}
		dispatch := d.field(line)
		d.line = d.line[:0]
		_, _ = d.r.Discard(consumed)
		if dispatch {
			if ev, ok := d.event(); ok {
				return ev, nil
			}
			d.reset()
		}
	}
}

// finish handles the end of the input.
func (d *Decoder) finish() (Event, error) {
	if len(d.line) > 0 {
		// The last line had no line end; take it, since servers sometimes stop there.
		d.field(d.line)
		d.line = d.line[:0]
	}
	d.err = io.EOF
	if d.lines == 0 {
		return Event{}, io.EOF
	}
	d.truncated = true
	if d.hasData {
		ev, _ := d.event()
		return ev, nil
	}
	return Event{}, io.EOF
}

// grow counts n more bytes of the current event against the limit.
func (d *Decoder) grow(n int) error {
	if d.size+n > d.maxEvent {
		d.err = fmt.Errorf("sse: event exceeds %d bytes: %w", d.maxEvent, ErrEventTooLarge)
		return d.err
	}
	d.size += n
	return nil
}

func (d *Decoder) reset() {
	d.size, d.lines = 0, 0
	d.data = d.data[:0]
	d.hasData, d.comment = false, false
	d.name = ""
}

// field processes one line, without its line end, and reports whether it was blank.
func (d *Decoder) field(line []byte) bool {
	if len(line) == 0 {
		return true
	}
	d.lines++
	if line[0] == ':' {
		d.comment = true
		return false
	}
	name, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		if d.hasData {
			d.data = append(d.data, '\n')
		}
		d.data = append(d.data, value...)
		d.hasData = true
	case "event":
		// Streams repeat the same few names; reusing the string keeps named events from allocating.
		if string(value) != d.lastName {
			d.lastName = string(value)
		}
		d.name = d.lastName
	}
	return false
}

// event returns the event read so far, if it is one to return.
func (d *Decoder) event() (Event, bool) {
	switch {
	case d.hasData:
		data := d.data
		if data == nil {
			data = []byte{} // "data:" with nothing after it is an event with empty data
		}
		return Event{Name: d.name, Data: data}, true
	case d.comment:
		return Event{Comment: true}, true
	}
	return Event{}, false
}

func indexLineEnd(b []byte) int {
	for i, c := range b {
		if c == '\n' || c == '\r' {
			return i
		}
	}
	return -1
}

// AppendData appends an event whose data is data: one "data:" line per line of data, whichever of
// LF, CRLF or CR ends it, then the blank line.
func AppendData(dst, data []byte) []byte {
	for {
		i := indexLineEnd(data)
		if i < 0 {
			break
		}
		dst = append(dst, "data: "...)
		dst = append(dst, data[:i]...)
		dst = append(dst, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, '\n', '\n')
}

// IsDone reports whether data is [DONE], which ends an OpenAI stream.
func IsDone(data []byte) bool { return string(bytes.TrimSpace(data)) == "[DONE]" }
