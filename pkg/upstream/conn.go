package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
)

// errUnsolicited is why a connection is closed whose backend sent bytes no request had asked for.
var errUnsolicited = errors.New("backend sent bytes no request asked for")

// conn is an HTTP/1.1 connection to a backend, as net/http's Transport sees it (on https://,
// above TLS). It keeps every exchange's bytes to that exchange, and it lets a backend's early
// answer through.
//
// One exchange's bytes: the Transport puts a connection back in its pool as soon as an answer's
// body ends, and only then looks whether bytes beyond the answer were already read ("Unsolicited
// response received on idle HTTP channel", which closes the connection). A request that took the
// connection in between would be handed those bytes as its answer: a backend that followed one
// organization's answer with a second one would answer another organization's request with it.
// So a request starts on a connection only once the Transport has looked past the last answer:
// it read with nothing buffered, or it closed the connection. And what a read brings before any
// of the next request is written belongs to no request: it closes the connection unread.
//
// An early answer: a backend that answers before it has read a large request (a 413 of its own)
// and closes the connection resets the request's write, and the Transport then returns the
// write's error, not the answer that had already arrived (golang/go#11745). Once some of a
// request has left, a failed write is reported done, so that the Transport reads what the backend
// answered, or fails on that read; a later request on the connection fails with nothing of it
// sent, which roundTrip sends again.
type conn struct {
	net.Conn

	mu      sync.Mutex
	writing bool          // the current request's write has begun: what is read is its answer
	sending bool          // some of the current request has left
	err     error         // the write that failed: the connection is broken
	ended   bool          // the last answer ended and the Transport has not read since
	looked  bool          // the Transport looked past the last answer, or nothing was read yet
	wait    chan struct{} // a request waits for looked; closed when it is set
	closed  bool
}

// dialFunc dials a backend.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dialConn wraps dial's connections in conn.
func dialConn(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newConn(c), nil
	}
}

// dialTLS dials an https:// backend and shakes hands as t would, with t's TLS configuration
// (which the Transport makes offer h2 first). A connection that agreed on HTTP/2 is returned as
// it is: HTTP/2 names the stream of every answer. Any other is a conn, as on http://.
func dialTLS(t *http.Transport, dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := t.TLSClientConfig.Clone()
		if cfg == nil {
			cfg = new(tls.Config)
		}
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(raw, cfg)
		hctx, cancel := context.WithTimeout(ctx, t.TLSHandshakeTimeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			raw.Close()
			return nil, err
		}
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			return tc, nil
		}
		return newConn(tc), nil
	}
}

// newConn wraps c, a new connection: nothing was read on it before the first request.
func newConn(c net.Conn) *conn { return &conn{Conn: c, looked: true} }

// start begins a request on the connection (the trace's GotConn), once the Transport has looked
// past the last answer; false if ctx ended first. Until some of the request has left, a failure is
// reported as it is.
func (c *conn) start(ctx context.Context) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.looked && !c.closed {
		// Rare: the Transport is about to look, a moment after it pooled the connection.
		if c.wait == nil {
			c.wait = make(chan struct{})
		}
		wait := c.wait
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			c.mu.Lock()
			return false
		}
		c.mu.Lock()
	}
	c.looked, c.writing, c.sending = false, false, false
	return true
}

// answered ends a request on the connection (the trace's PutIdleConn): its answer has ended and
// the Transport has put the connection back in its pool.
func (c *conn) answered() {
	c.mu.Lock()
	c.writing, c.sending, c.ended = false, false, true
	c.mu.Unlock()
}

// sent reports whether some of the current request has left.
func (c *conn) sent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sending
}

func (c *conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.ended {
		// The Transport reads past the last answer, so nothing beyond it was buffered.
		c.ended = false
		c.lookedPast()
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.writing {
		c.closeLocked()
		return 0, errUnsolicited
	}
	return n, err
}

// Write does not hold the lock while it writes: a backend that answers early without reading
// leaves the write waiting, and the Transport must still read the answer meanwhile.
func (c *conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writing = true
	broken, sending := c.err, c.sending
	c.mu.Unlock()
	if broken != nil {
		if sending {
			return len(p), nil
		}
		return 0, broken
	}
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sending = c.sending || n > 0
	if err != nil {
		c.err = err
		if c.sending {
			return len(p), nil
		}
	}
	return n, err
}

func (c *conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeLocked()
}

func (c *conn) closeLocked() error {
	if c.closed {
		return nil
	}
	c.closed = true
	c.lookedPast() // a request waiting to start fails at once, with nothing sent
	return c.Conn.Close()
}

// lookedPast lets a request start.
func (c *conn) lookedPast() {
	c.looked = true
	if c.wait != nil {
		close(c.wait)
		c.wait = nil
	}
}
