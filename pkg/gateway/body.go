package gateway

import (
	"io"
	"net/http"
	"time"
)

// bodyReader reads a request body with no gap between bytes longer than every (contract section
// 2, step 0): before each read it moves the connection's read deadline that far ahead, and done
// clears it once the body is read, so that the connection's reads after the body (net/http
// watches them to see the client leave) have none. After a failed read the deadline is left as it
// is: the server then gives up the rest of the body at once instead of waiting for it. Where the connection has no deadlines (Lambda hands the handler a body
// already received) it reads as the body does.
type bodyReader struct {
	body  io.ReadCloser
	w     http.ResponseWriter // nil once it is known to have no deadlines
	every time.Duration
	set   bool // a deadline is set on the connection
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if r.w != nil {
		// The socket's deadline is on the system's clock, whatever clock the gateway was given.
		if err := http.NewResponseController(r.w).SetReadDeadline(time.Now().Add(r.every)); err != nil {
			r.w = nil // not a connection with deadlines
		} else {
			r.set = true
		}
	}
	return r.body.Read(p)
}

func (r *bodyReader) Close() error { return r.body.Close() }

// done clears the deadline the body's reads set.
func (r *bodyReader) done() {
	if r.set {
		_ = http.NewResponseController(r.w).SetReadDeadline(time.Time{})
		r.set = false
	}
}

// abortIfGone ends the response without a status when the client left before one was sent
// (recorded as 499): net/http would otherwise send a 200 with an empty body, which a client that
// only half-closed its connection would read as an empty success. The connection is closed
// instead; the deferred settlement runs as the handler unwinds.
func (x *exchange) abortIfGone() {
	if x.event.HTTPStatus == statusClientGone {
		panic(http.ErrAbortHandler)
	}
}

// statusClientGone is the status recorded when the client left before any was sent (nginx's 499).
const statusClientGone = 499
