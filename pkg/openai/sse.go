package openai

import (
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

// readBuffer is the size of the decoder's read buffer, which an open stream holds while it waits.
// Model servers' events are a few hundred bytes; a longer line is gathered across reads. A burst
// of events that fits in one buffer is flushed to the client in one write (see Pending), so it
// should hold several events; a read from a backend's connection brings at most its read buffer
// (pkg/upstream: 2 KiB) anyway.
const readBuffer = 2 << 10

// retained bounds the event and line buffers a decoder keeps for the next event: after an
// unusually large event they are dropped rather than held for the rest of the stream.
const retained = 64 << 10

// Decoder reads server-sent events as the WHATWG EventSource rules parse them: lines end in LF,
// CRLF or CR; "data:" lines accumulate; a blank line dispatches; a leading byte-order mark is
// skipped. Decoder does not wait for more input than an event needs, so each event is returned as
// soon as its blank line arrives.
type Decoder struct {
	src      io.Reader
	maxEvent int

	buf  []byte // buf[r:w] is input read and not yet decoded
	r, w int

	started   bool // the byte-order mark check is done
	skipLF    bool // the last line ended in CR, so a leading LF belongs to it
	eof       bool // the input is exhausted
	truncated bool
	err       error // sticky
	readErr   error // returned by a read along with input, to report once that input is decoded

	line []byte // a line that spans reads

	// The event being read. Its data is a slice of buf when it is one line read in one piece,
	// as model servers send it: an open stream then keeps no copy of its last event. Otherwise,
	// and before buf is read into again, the data is gathered in own.
	size    int // bytes of the event so far, line ends included
	lines   int // lines of the event so far
	data    []byte
	own     []byte
	inBuf   bool // data is a slice of buf
	hasData bool
	comment bool
	name    string

	lastName string // the previous event's name
}

// NewDecoder returns a Decoder that reads from r with events of at most DefaultMaxEvent bytes.
func NewDecoder(r io.Reader) *Decoder { return NewDecoderSize(r, DefaultMaxEvent) }

// NewDecoderSize returns a Decoder whose events may have at most maxEvent bytes, counting each line
// end as one; a longer one is an error wrapping ErrEventTooLarge. maxEvent <= 0 means
// DefaultMaxEvent.
func NewDecoderSize(r io.Reader, maxEvent int) *Decoder {
	if maxEvent <= 0 {
		maxEvent = DefaultMaxEvent
	}
	return &Decoder{src: r, maxEvent: maxEvent, buf: make([]byte, readBuffer)}
}

// Pending reports whether the bytes already read hold the end of another event, so that Next
// will return without waiting for input. A relay flushes its output only when nothing is pending:
// a burst of events then costs one write to the client, and no event ever waits for a later one.
func (d *Decoder) Pending() bool {
	b := d.buffered()
	// A blank line is two line ends in a row: LF LF, LF CR (CR or CRLF after LF), or CR CR. The
	// last two need a CR, which most servers never send.
	if bytes.Contains(b, []byte("\n\n")) {
		return true
	}
	return bytes.IndexByte(b, '\r') >= 0 && (bytes.Contains(b, []byte("\n\r")) || bytes.Contains(b, []byte("\r\r")))
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
		d.start()
	}
	for {
		if d.eof {
			return d.finish()
		}
		// Decode what is buffered; read only when nothing is, so as not to hold back an event.
		if d.r == d.w {
			if err := d.fill(); err == io.EOF {
				d.eof = true
				continue
			} else if err != nil {
				return Event{}, d.fail(err)
			}
		}
		if ev, ok, err := d.scan(); ok || err != nil {
			return ev, err
		}
	}
}

// start skips a byte-order mark at the start of the input.
func (d *Decoder) start() {
	d.started = true
	for d.w-d.r < 3 && d.readErr == nil {
		if err := d.fill(); err != nil {
			d.readErr = err // reported by Next once the bytes before it are decoded
		}
	}
	if bytes.HasPrefix(d.buffered(), []byte("\xef\xbb\xbf")) {
		d.r += 3
	}
}

// fill reads more input. A read error that comes with input is kept in readErr and returned once
// that input is decoded. As bufio.Reader does, fill gives up on a reader that keeps returning
// nothing.
func (d *Decoder) fill() error {
	if d.inBuf {
		d.own = append(d.own[:0], d.data...)
		d.data, d.inBuf = d.own, false
	}
	if d.r == d.w {
		if err := d.readErr; err != nil {
			d.readErr = nil
			return err
		}
		d.r, d.w = 0, 0
	}
	p := d.buf[d.w:]
	n, err := 0, error(io.ErrNoProgress)
	for range 100 {
		if n, err = d.src.Read(p); n > 0 || err != nil {
			break
		}
		err = io.ErrNoProgress
	}
	if n == 0 {
		return err
	}
	d.w += n
	d.readErr = err
	return nil
}

func (d *Decoder) buffered() []byte { return d.buf[d.r:d.w] }

// fail makes err sticky.
func (d *Decoder) fail(err error) error {
	d.err = err
	return err
}

// scan decodes the buffered input, up to the end of the first event in it or of the buffer. ok
// reports that ev is an event to return.
func (d *Decoder) scan() (ev Event, ok bool, err error) {
	for d.r < d.w {
		b := d.buf[d.r:d.w]
		if d.skipLF {
			d.skipLF = false
			if b[0] == '\n' {
				d.r++
				continue
			}
		}
		i := indexLineEnd(b)
		if i < 0 {
			if err := d.grow(len(b)); err != nil {
				return Event{}, false, d.fail(err)
			}
			d.line = append(d.line, b...)
			d.r = d.w
			return Event{}, false, nil
		}
		line, inBuf := b[:i], len(d.line) == 0
		if !inBuf {
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
			return Event{}, false, d.fail(err)
		}
		dispatch := d.field(line, inBuf)
		d.line = d.line[:0]
		d.r += consumed
		if dispatch {
			if ev, ok := d.event(); ok {
				return ev, true, nil
			}
			d.reset()
		}
	}
	return Event{}, false, nil
}

// finish handles the end of the input.
func (d *Decoder) finish() (Event, error) {
	if len(d.line) > 0 {
		// The last line had no line end; take it, since servers sometimes stop there.
		d.field(d.line, false)
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
		return fmt.Errorf("sse: event exceeds %d bytes: %w", d.maxEvent, ErrEventTooLarge)
	}
	d.size += n
	return nil
}

// reset starts a new event. The buffers of an unusually large event are dropped, not kept.
func (d *Decoder) reset() {
	d.size, d.lines = 0, 0
	d.data, d.inBuf, d.own = nil, false, d.own[:0]
	if cap(d.own) > retained {
		d.own = nil
	}
	if cap(d.line) > retained {
		d.line = nil
	}
	d.hasData, d.comment = false, false
	d.name = ""
}

// field processes one line, without its line end, and reports whether it was blank. inBuf: the
// line is a slice of buf.
func (d *Decoder) field(line []byte, inBuf bool) bool {
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
		switch {
		case !d.hasData && inBuf:
			d.data, d.inBuf = value, true
		case !d.hasData:
			d.own = append(d.own[:0], value...)
			d.data = d.own
		default: // a second data line: the first is copied unless it is already in own
			d.own = append(append(append(d.own[:0], d.data...), '\n'), value...)
			d.data, d.inBuf = d.own, false
		}
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

// indexLineEnd returns the offset of the first CR or LF in b, -1 if there is none.
func indexLineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
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
