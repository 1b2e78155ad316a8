package main

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/neocloud/kiln/pkg/openai"
)

// The HTTP server answers some requests before any handler sees them: headers over
// MaxHeaderBytes (431), a malformed request line or header (400), an unknown transfer coding
// (501), an unsupported HTTP version (505; both are answered as 400, the client's fault, so that
// a 5xx always means the service failed). net/http writes those itself, as plain text, straight
// to the connection; and a request whose headers do not arrive within ReadHeaderTimeout it closes
// without a word. The contract (section 2, step 0) wants the error shape of section 3 for all of
// them, and a 408 for the timeout. net/http offers no hook for either, so the listener hands it
// connections that do it: conn recognises net/http's own error answers on their way out and writes
// JSON instead, and answers 408 when a read of a request's headers hits its deadline.
//
// What cannot be changed: the connection is closed after each of these, as net/http closes it; a
// client that sent nothing at all on a kept-alive connection is closed without an answer when
// IdleTimeout passes (an answer nobody asked for would be read as the next response).

// listener wraps accepted connections in conn.
type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c}, nil
}

// conn is one client connection, told by connState whether the server is reading a request's
// line and headers (between requests) or serving one.
type conn struct {
	net.Conn
	between  atomic.Bool // the server is reading a request line and headers
	started  atomic.Bool // ... of a request begun: the first since accept, or one with bytes in
	answered atomic.Bool // an error answer was written; the server closes the connection next
}

// connState is the server's ConnState hook: it tells each conn where the server is.
func connState(c net.Conn, state http.ConnState) {
	cc, ok := c.(*conn)
	if !ok {
		return
	}
	switch state {
	case http.StateNew, http.StateIdle:
		cc.started.Store(state == http.StateNew)
		cc.between.Store(true)
	case http.StateActive:
		cc.between.Store(false)
	}
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.between.Load() {
		return n, err
	}
	if n > 0 {
		c.started.Store(true)
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.started.Load() {
		// The header timeout (or, with part of a request in, the idle timeout) passed.
		c.answer(http.StatusRequestTimeout, "request_timeout", "The request's headers did not arrive in time. Send the request line and headers without pausing.")
	}
	return n, err
}

// netHTTPError is how net/http starts the answers it writes itself (server.go, conn.serve): a
// status line, then exactly these two headers in this order. A handler's answer never starts so:
// the server writes a handler's headers sorted by name, Connection before Content-Type.
var netHTTPError = []byte("\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")

// CloseWrite half-closes the connection, as net/http does after a 431 so that the client reads it.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *conn) Write(p []byte) (int, error) {
	if len(p) > 9 && (p[9] == '4' || p[9] == '5') { // "HTTP/1.1 4…": cheap for every other write
		return c.writeError(p)
	}
	return c.Conn.Write(p)
}

func (c *conn) writeError(p []byte) (int, error) {
	if c.answered.Load() {
		// After a 408 of ours net/http may still parse what had arrived ("0" reads as a request
		// line once the read fails) and refuse it: the client has its answer, and the server
		// closes the connection next.
		return len(p), nil
	}
	if status, text, ok := parseNetHTTPError(p); ok {
		code, msg := describeNetHTTPError(status, text)
		if status >= 500 {
			// net/http's 501 (a transfer coding it does not know) and 505 (another HTTP version)
			// refuse what the client sent: a 400, so that a 5xx always means the service failed.
			status = http.StatusBadRequest
		}
		if err := c.answer(status, code, msg); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// parseNetHTTPError reads an answer net/http wrote itself: its status and the text after the
// status line's reason ("missing required Host header"), if any.
func parseNetHTTPError(p []byte) (status int, text string, ok bool) {
	if len(p) < len("HTTP/1.1 400 ") || !bytes.HasPrefix(p, []byte("HTTP/1.1 ")) {
		return 0, "", false
	}
	line, _, found := bytes.Cut(p, []byte("\r\n"))
	if !found || !bytes.HasPrefix(p[len(line):], netHTTPError) {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil || status < 400 {
		return 0, "", false
	}
	if _, after, found := bytes.Cut(line[12:], []byte(": ")); found {
		text = string(after)
	}
	return status, text, true
}

// describeNetHTTPError names net/http's own refusals in the API's terms. Their texts are net/http's
// constants, never the client's bytes.
func describeNetHTTPError(status int, text string) (code, msg string) {
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		return "request_header_fields_too_large", "The request's headers are larger than the server accepts (64 KiB)."
	case http.StatusNotImplemented:
		return "unsupported_transfer_encoding", "The request's Transfer-Encoding is not supported; send chunked or a Content-Length."
	case http.StatusHTTPVersionNotSupported:
		return "http_version_not_supported", "The request's HTTP version is not supported; use HTTP/1.1."
	}
	if text == "" {
		text = "malformed request line or headers"
	}
	return "malformed_request", "The request could not be read as HTTP: " + text + "."
}

// answer writes a JSON error in the contract's shape, as the gateway writes every error, straight
// to the connection, once. The server closes the connection after it.
func (c *conn) answer(status int, code, msg string) error {
	if !c.answered.CompareAndSwap(false, true) {
		return nil
	}
	body := append(openai.Error{Message: msg, Type: openai.TypeInvalidRequest, Code: code}.AppendJSON(nil), '\n')
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) + "\r\n")
	b.WriteString("Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n")
	b.Write(body)
	// A client that does not read must not hold the server: the answer is small, and a socket
	// takes it whole unless its buffer is full; then it is given up.
	_ = c.Conn.SetWriteDeadline(time.Now().Add(answerWriteLimit))
	_, err := c.Conn.Write(b.Bytes())
	return err
}

// answerWriteLimit bounds the write of an answer conn makes itself.
const answerWriteLimit = 5 * time.Second
