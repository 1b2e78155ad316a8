package upstream

import (
	"context"
	"net"
	"sync"
)

// earlyAnswerConn is a connection to an http:// backend that lets the backend's early answer
// through. A backend that answers before it has read a large request (a 413 of its own) and
// closes the connection resets the request's write, and net/http's Transport then returns the
// write's error, not the answer that had already arrived (golang/go#11745). Once some of a
// request has left, a failed write is reported done, so that the Transport reads what the
// backend answered, or fails on that read; a later request on the connection fails with nothing
// of it sent, which roundTrip sends again.
type earlyAnswerConn struct {
	net.Conn

	mu      sync.Mutex
	sending bool  // some of the current request has left
	err     error // the write that failed: the connection is broken
}

// dialEarlyAnswer wraps dial's connections in earlyAnswerConn.
func dialEarlyAnswer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &earlyAnswerConn{Conn: c}, nil
	}
}

// start begins a request on the connection (the trace's GotConn): until some of it has left, a
// failure is reported as it is.
func (c *earlyAnswerConn) start() {
	c.mu.Lock()
	c.sending = false
	c.mu.Unlock()
}

// sent reports whether some of the current request has left.
func (c *earlyAnswerConn) sent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sending
}

func (c *earlyAnswerConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		if c.sending {
			return len(p), nil
		}
		return 0, c.err
	}
	n, err := c.Conn.Write(p)
	c.sending = c.sending || n > 0
	if err != nil {
		c.err = err
		if c.sending {
			return len(p), nil
		}
	}
	return n, err
}
