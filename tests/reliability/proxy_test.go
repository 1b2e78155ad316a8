package reliability

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fault is what the fault proxy does to a connection.
type fault struct {
	kind  faultKind
	after int64         // bytes of the backend's answer let through first
	stall time.Duration // how long a stall lasts before the connection is reset
}

type faultKind int

const (
	pass         faultKind = iota // forward both ways
	resetOnOpen                   // accept, then reset before anything is read
	resetAfter                    // forward `after` bytes of the answer, then reset both sides
	stallHeaders                  // read the request, never answer; reset after `stall`
	stallAfter                    // forward `after` bytes of the answer, go silent for `stall`, then reset
	refuse                        // the listener is closed: connections are refused
	cutOff                        // refuse, and the connections open now are reset
)

// faultProxy is a TCP proxy between the gateway and a backend whose behaviour the test sets.
type faultProxy struct {
	t      *testing.T
	target string
	addr   string

	mu   sync.Mutex
	ln   net.Listener
	mode fault
	open map[*net.TCPConn]bool // the client side of each connection being proxied

	answered atomic.Int64 // bytes of backend answers forwarded to the gateway
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, target: target, addr: ln.Addr().String(), ln: ln, open: map[*net.TCPConn]bool{}}
	go p.serve(ln)
	t.Cleanup(func() {
		p.mu.Lock()
		if p.ln != nil {
			p.ln.Close()
		}
		p.mu.Unlock()
	})
	return p
}

// URL is the proxy's base URL for a catalog backend.
func (p *faultProxy) URL() string { return "http://" + p.addr + "/v1" }

// set changes what happens to the next connections; refuse closes the listener, cutOff also
// resets the connections open now, anything else opens it again on the same address.
func (p *faultProxy) set(f fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = f
	if f.kind == cutOff {
		for c := range p.open {
			reset(c)
		}
	}
	if f.kind == refuse || f.kind == cutOff {
		if p.ln != nil {
			p.ln.Close()
			p.ln = nil
		}
		return
	}
	if p.ln == nil {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.t.Fatalf("reopen proxy on %s: %v", p.addr, err)
		}
		p.ln = ln
		go p.serve(ln)
	}
}

func (p *faultProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		f := p.mode
		p.mu.Unlock()
		go p.handle(c.(*net.TCPConn), f)
	}
}

func reset(c *net.TCPConn) {
	_ = c.SetLinger(0) // close with RST
	_ = c.Close()
}

func (p *faultProxy) handle(down *net.TCPConn, f fault) {
	p.mu.Lock()
	p.open[down] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.open, down)
		p.mu.Unlock()
	}()
	switch f.kind {
	case resetOnOpen:
		reset(down)
		return
	case stallHeaders:
		go io.Copy(io.Discard, down)
		time.Sleep(f.stall)
		reset(down)
		return
	}
	c, err := net.Dial("tcp", p.target)
	if err != nil {
		reset(down)
		return
	}
	up := c.(*net.TCPConn)
	go func() {
		_, _ = io.Copy(up, down)
		_ = up.CloseWrite()
	}()
	limit := int64(-1)
	if f.kind == resetAfter || f.kind == stallAfter {
		limit = f.after
	}
	buf := make([]byte, 32<<10)
	var sent int64
	for {
		n, err := up.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if limit >= 0 && sent+int64(n) >= limit {
				chunk = chunk[:limit-sent]
				_, _ = down.Write(chunk)
				p.answered.Add(int64(len(chunk)))
				if f.kind == stallAfter {
					time.Sleep(f.stall)
				}
				reset(down)
				reset(up)
				return
			}
			if _, werr := down.Write(chunk); werr != nil {
				reset(up)
				reset(down)
				return
			}
			sent += int64(n)
			p.answered.Add(int64(n))
		}
		if err != nil {
			_ = down.CloseWrite()
			_ = down.Close()
			_ = up.Close()
			return
		}
	}
}
