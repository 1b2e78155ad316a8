package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// conns sends requests to a backend on plain http:// (a model server in the same network) over
// kept-alive HTTP/1.1 connections, on the caller's goroutine: a request leaves in one write system
// call (one larger than syncWriteMax is written beside the read of its answer), and the response
// is read by the goroutine that relays it.
//
// net/http's Transport, which https:// backends keep, gives every connection a reading and a
// writing goroutine and hands each request and response between them and the caller. For a
// gateway whose every request is a proxied stream that costs two goroutine stacks, a 4 KiB write
// buffer and four goroutine hand-offs per request; here a connection is a socket and its
// readBufferSize read buffer. The framing is still the standard library's: http.ReadResponse parses the answer
// and decodes its body, http.Header.Write writes the header lines.
type conns struct {
	addr          string // host:port
	head          []byte // "POST " + the base URL's path, completed by the path of each request
	header        []byte // the header lines every request carries, Host first
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	headerTimeout time.Duration
	idleFor       time.Duration // how long an idle connection is kept: idleConnTimeout

	mu    sync.Mutex
	idle  []*conn // kept-alive connections, longest idle first
	sweep *time.Timer
}

// readBufferSize is a connection's read buffer, which an open stream holds while it waits: half
// the Transport's 4 KiB. A read takes the events that wait, and at 8 busy connections those of
// the simulator fit in 1 KiB as well as in 4 (CPU per relayed chunk measured the same); a larger
// burst takes one more read.
const readBufferSize = 2 << 10

// maxIdleConns bounds a backend's idle connections; more are closed as their requests end.
const maxIdleConns = 256

// conn is one connection to a backend.
type conn struct {
	nc     net.Conn
	br     *bufio.Reader // reads from the conn itself, which counts what the headers may still take
	limit  int64
	idleAt time.Time
}

// maxHeaderBytes bounds a response's header lines, as the Transport's MaxResponseHeaderBytes does
// (a tenth of its default: a model server's take a few hundred bytes).
const maxHeaderBytes = 1 << 20

var errHeadersTooLarge = errors.New("backend response headers exceed 1 MiB")

func (c *conn) Read(p []byte) (int, error) {
	if c.limit <= 0 {
		return 0, errHeadersTooLarge
	}
	if int64(len(p)) > c.limit {
		p = p[:c.limit]
	}
	n, err := c.nc.Read(p)
	c.limit -= int64(n)
	return n, err
}

func newConns(u *url.URL, header http.Header, opt Options) *conns {
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	c := &conns{
		addr:          addr,
		head:          append([]byte("POST "), u.EscapedPath()...),
		dial:          (&net.Dialer{Timeout: opt.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		headerTimeout: opt.HeaderTimeout,
		idleFor:       idleConnTimeout,
	}
	var b bytes.Buffer
	b.WriteString("Host: " + u.Host + "\r\n")
	_ = header.Write(&b) // cannot fail: a bytes.Buffer does not
	c.header = b.Bytes()
	return c
}

// errHeaderTimeout is a backend that took longer than Options.HeaderTimeout to take the request
// and answer it.
var errHeaderTimeout = errors.New("timeout awaiting the backend's response headers")

// roundTrip POSTs body to path and returns once the response headers have arrived. sent reports
// whether any byte of the request may have reached the backend. The response body must be read to
// its end or closed; the connection goes back to the pool only after its end was read.
// auth is an extra header line ("" for none): a token read at run time.
func (cs *conns) roundTrip(ctx context.Context, path, auth string, body []byte) (*http.Response, bool, error) {
	// A request up to syncWriteMax is sent as one slice, header lines and body: one allocation
	// and one write. A larger one is sent from two, without copying its body.
	size := len(cs.head) + len(path) + len(cs.header) + len(auth) + 48
	whole := size+len(body) <= syncWriteMax
	if whole {
		size += len(body)
	}
	head := make([]byte, 0, size)
	head = append(append(append(head, cs.head...), path...), " HTTP/1.1\r\n"...)
	head = append(append(head, cs.header...), auth...)
	head = append(strconv.AppendInt(append(head, "Content-Length: "...), int64(len(body)), 10), "\r\n\r\n"...)
	if whole {
		head, body = append(head, body...), nil
	}
	for {
		// A caller that already left sends nothing (its context would close the connection
		// under the write, or not in time).
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		c, reused, err := cs.get(ctx)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				err = ctxErr
			}
			return nil, false, err
		}
		resp, sent, err := cs.exchange(ctx, c, head, body, whole)
		if err == nil || sent || !reused {
			return resp, sent, err
		}
		// A kept-alive connection closed before anything was written to it: a fresh one may do.
	}
}

// syncWriteMax is the largest request written before its answer is read. A request that fits the
// sockets' buffers is taken whole by the kernel whatever the backend does; a larger one is written
// on another goroutine while its answer is read, so that a backend that answers early (413, 400)
// and stops reading is heard, as the Transport hears it.
const syncWriteMax = 64 << 10

type written struct {
	n   int64
	err error
}

// exchange sends head and body on c and reads the answer's headers; whole: body is empty, and
// head the whole request.
func (cs *conns) exchange(ctx context.Context, c *conn, head, body []byte, whole bool) (*http.Response, bool, error) {
	// Cancelling the caller's context closes the connection, which ends a write or read under way.
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	if cs.headerTimeout > 0 {
		_ = c.nc.SetDeadline(time.Now().Add(cs.headerTimeout)) // for the write and the headers
	}
	var writing chan written // the background write of a large request
	fail := func(err error, sent bool) (*http.Response, bool, error) {
		stop()
		c.nc.Close()
		if writing != nil {
			sent = (<-writing).n > 0 // ended by the close
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = errHeaderTimeout
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		return nil, sent, err
	}
	if whole {
		if n, err := c.nc.Write(head); err != nil {
			return fail(err, n > 0)
		}
	} else {
		w := make(chan written, 1)
		writing = w
		go func() {
			bufs := net.Buffers{head, body}
			n, err := bufs.WriteTo(c.nc)
			w <- written{n, err}
		}()
	}
	c.limit = maxHeaderBytes
	resp, err := http.ReadResponse(c.br, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(c.br, nil) // an interim answer: the real one follows
	}
	c.limit = math.MaxInt64
	if err != nil {
		return fail(err, true)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return fail(fmt.Errorf("unexpected %s", resp.Status), true)
	}
	if cs.headerTimeout > 0 {
		_ = c.nc.SetDeadline(time.Time{})
	}
	resp.Body = &connBody{ctx: ctx, cs: cs, c: c, body: resp.Body, stop: stop, writing: writing, keep: !resp.Close}
	return resp, true, nil
}

// connBody is a response body on a pooled connection. Read to its end, it gives the connection back
// to the pool. Closed before its end, it reads what is left in the background, and keeps the
// connection if that end comes soon: a stream's chunked encoding ends a moment after its [DONE]
// event, which is where a relay stops reading. After an error, a cancelled context, or a response
// the backend ends by closing, the connection is closed.
type connBody struct {
	ctx     context.Context
	cs      *conns
	c       *conn
	body    io.ReadCloser // from http.ReadResponse; never closed, which would wait for the rest
	stop    func() bool   // stops the context's hold on the connection; false once it closed it
	writing chan written  // a large request's write, which may still be under way; or nil
	keep    bool          // the backend keeps the connection open after this response
	mu      sync.Mutex
	done    bool  // the connection was given back or closed: the body is over
	reading bool  // a Read is under way
	err     error // what ended the body when a Read did: io.EOF at its end
}

// drainFor and maxDrain bound what a closed body still reads to keep its connection. A body closed
// in the middle of a stream (the relay failed) is not over soon, and the backend must stop
// generating: its connection is closed after at most drainFor. (net/http's Transport reads up to
// 256 KiB, on the caller's goroutine.)
const (
	drainFor = 100 * time.Millisecond
	maxDrain = 4 << 10
)

func (b *connBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.done {
		err := b.err
		b.mu.Unlock()
		if err == nil {
			err = http.ErrBodyReadAfterClose
		}
		return 0, err
	}
	b.reading = true
	b.mu.Unlock()

	n, err := b.body.Read(p)
	if err != nil && err != io.EOF && b.ctx.Err() != nil {
		err = b.ctx.Err() // the connection was closed because the caller left
	}

	b.mu.Lock()
	b.reading = false
	closed := b.done // by Close, during the read
	if err != nil && !closed {
		b.done, b.err = true, err
	}
	b.mu.Unlock()
	if err != nil && !closed {
		b.finish(err == io.EOF)
	}
	return n, err
}

// finish gives the connection back after the body's end, or closes it. Whatever follows the end
// of an answer belongs to no request: the connection is reused only when nothing does, when its
// request was written whole, and when the caller's context did not close it already.
func (b *connBody) finish(atEnd bool) {
	held := b.stop()
	if atEnd && held && b.keep && b.c.br.Buffered() == 0 && b.writtenWhole() {
		b.cs.put(b.c)
		return
	}
	b.c.nc.Close()
}

// writtenWhole reports whether the request was written whole. A write still under way, which
// waits for a backend that answered before reading it all, is ended by a past deadline; one that
// has just ended is waited for (the Transport too waits for its writer before it reuses a
// connection).
func (b *connBody) writtenWhole() bool {
	if b.writing == nil {
		return true
	}
	nc := b.c.nc
	_ = nc.SetWriteDeadline(time.Unix(1, 0))
	w := <-b.writing
	b.writing = nil
	return w.err == nil && nc.SetWriteDeadline(time.Time{}) == nil
}

// Close ends the body. During a Read it closes the connection, which ends the Read.
func (b *connBody) Close() error {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return nil
	}
	b.done = true
	reading := b.reading
	b.mu.Unlock()
	if held := b.stop(); !held || !b.keep || reading {
		return b.c.nc.Close()
	}
	go b.drain()
	return nil
}

// drain reads the rest of a closed body and gives the connection back if its end came in time.
func (b *connBody) drain() {
	_ = b.c.nc.SetReadDeadline(time.Now().Add(drainFor))
	_, err := io.CopyN(io.Discard, b.body, maxDrain)
	if err == io.EOF && b.c.nc.SetReadDeadline(time.Time{}) == nil && b.c.br.Buffered() == 0 && b.writtenWhole() {
		b.cs.put(b.c)
		return
	}
	b.c.nc.Close()
}

// get returns a kept-alive connection, or dials a new one. reused: the connection served a request
// before, so the backend may have closed it since.
func (cs *conns) get(ctx context.Context) (*conn, bool, error) {
	for {
		cs.mu.Lock()
		n := len(cs.idle)
		if n == 0 {
			cs.mu.Unlock()
			break
		}
		c := cs.idle[n-1]
		cs.idle[n-1] = nil
		cs.idle = cs.idle[:n-1]
		cs.mu.Unlock()
		if time.Since(c.idleAt) < cs.idleFor && alive(c.nc) {
			return c, true, nil
		}
		c.nc.Close()
	}
	nc, err := cs.dial(ctx, "tcp", cs.addr)
	if err != nil {
		return nil, false, err
	}
	c := &conn{nc: nc, limit: math.MaxInt64}
	c.br = bufio.NewReaderSize(c, readBufferSize)
	return c, false, nil
}

// put keeps c for a later request, or closes it when enough are kept.
func (cs *conns) put(c *conn) {
	c.idleAt = time.Now()
	cs.mu.Lock()
	if len(cs.idle) >= maxIdleConns {
		cs.mu.Unlock()
		c.nc.Close()
		return
	}
	cs.idle = append(cs.idle, c)
	if cs.sweep == nil {
		cs.sweep = time.AfterFunc(cs.idleFor, cs.closeExpired)
	}
	cs.mu.Unlock()
}

// closeExpired closes the connections idle for idleFor, and comes back for the rest when
// the longest idle of them expires.
func (cs *conns) closeExpired() {
	now := time.Now()
	cs.mu.Lock()
	n := 0
	for n < len(cs.idle) && now.Sub(cs.idle[n].idleAt) >= cs.idleFor {
		n++
	}
	expired := make([]*conn, n)
	copy(expired, cs.idle)
	cs.idle = append(cs.idle[:0], cs.idle[n:]...)
	clear(cs.idle[len(cs.idle) : len(cs.idle)+n])
	if len(cs.idle) > 0 {
		cs.sweep.Reset(cs.idleFor - now.Sub(cs.idle[0].idleAt))
	} else {
		cs.sweep = nil
	}
	cs.mu.Unlock()
	for _, c := range expired {
		c.nc.Close()
	}
}
