// Package upstream talks to model servers: it sends every backend's requests through a net/http
// Transport of its own, tracks each backend's health with a circuit breaker, picks a healthy
// backend for a model, retries on another backend only when nothing reached the first, and
// cancels the backend request the moment the caller's context ends.
package upstream

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
)

// ErrUnavailable means no backend of the model can take a request now (all unhealthy).
var ErrUnavailable = errors.New("no healthy backend")

// errAnotherAnswer is an answer that names another request than the one it came for, or none from
// a backend that names every answer (catalog: echoes_request_id).
var errAnotherAnswer = errors.New("the answer does not name the request it came for")

// requestIDHeader names each request to a backend, with requestIDPrefix and a random part. vLLM
// started with --enable-request-id-headers answers with the same header and the same id (its
// XRequestIdMiddleware), and names the request after it in its logs and its answer's id; a server
// that does not know the header ignores it. An answer that carries another id of ours is another
// request's (a duplicate answer the backend sent late, which reached the connection after the
// next request was written) and is refused. An answer without the header, or with an id that is
// not ours (a proxy in between that stamps ids of its own), cannot be checked, and is taken,
// unless the catalog says the backend echoes the header (echoes_request_id): then only its own
// id will do.
const (
	requestIDHeader = "X-Request-Id"
	requestIDPrefix = "kiln-"
)

// Error is a failure to get response headers from a backend: refused, reset, timed out.
type Error struct {
	Backend string
	Err     error
}

func (e *Error) Error() string { return "backend " + e.Backend + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Options tune the pool; zero values take the contract's defaults.
type Options struct {
	ConnectTimeout   time.Duration // default 10 s
	HeaderTimeout    time.Duration // wait for response headers; default 120 s
	FailureThreshold int           // consecutive failures that open a breaker; default 3
	OpenFor          time.Duration // how long an open breaker refuses; default 5 s
	Now              func() time.Time
	Getenv           func(string) string    // reads backends' api_key_env; nil reads nothing
	Tokens           map[string]TokenSource // by api_key_env name: tokens read at run time (secret.go)
}

// idleConnTimeout drops pooled connections before common model servers close them (uvicorn,
// under vLLM, closes idle keep-alive connections after 5 s). A request written on a connection
// the server is closing cannot be retried safely, so we would rather reconnect.
const idleConnTimeout = 4 * time.Second

// maxIdleConns bounds a backend's idle connections; more are closed as their requests end.
const maxIdleConns = 256

// readBufferSize is a connection's read buffer, which an open stream holds while it waits: half
// the Transport's default. A read takes the events that wait, and at 8 busy connections those of
// the simulator fit in 1 KiB as well as in 4 (CPU per relayed chunk measured the same); a larger
// burst takes one more read.
const readBufferSize = 2 << 10

// writeBufferSize is a connection's write buffer, which an open stream holds while it waits: a
// quarter of the Transport's default. The header lines and a body of a few hundred bytes still
// leave in one write; a larger body leaves from the buffer and then directly from its bytes.
const writeBufferSize = 1 << 10

// maxHeaderBytes bounds a backend's response header lines: a tenth of the Transport's default,
// and a model server's take a few hundred bytes.
const maxHeaderBytes = 1 << 20

// Pool holds the connections to every backend.
type Pool struct {
	opt      Options
	backends map[string]*backend
	next     atomic.Uint64
}

type backend struct {
	cfg    catalog.Backend
	base   url.URL     // the base URL, parsed once: each request's URL is a copy with its path
	header http.Header // every request's header: shared, and never written after New
	// transport sends the backend's requests. It follows no redirect: a model server's answer
	// is the answer, a redirect included.
	transport *http.Transport
	breaker   breaker
	token     TokenSource // the bearer token, when read at run time; nil when in header
}

// newTransport is what a backend's requests are sent through: kept-alive HTTP/1.1 connections,
// or HTTP/2 to an https:// backend that offers it. The Transport reads each connection on a
// goroutine of its own, so a connection the backend closed while idle leaves the pool at once.
// Its HTTP/1.1 connections keep each exchange's bytes to it and let an early answer through
// (conn); plain: the backend is on http://, else the dial shakes hands for TLS itself, to put the
// conn above TLS.
func newTransport(opt Options, plain bool) *http.Transport {
	dial := (&net.Dialer{Timeout: opt.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	t := &http.Transport{
		MaxIdleConns:           maxIdleConns,
		MaxIdleConnsPerHost:    maxIdleConns,
		IdleConnTimeout:        idleConnTimeout,
		ResponseHeaderTimeout:  opt.HeaderTimeout,
		TLSHandshakeTimeout:    opt.ConnectTimeout,
		MaxResponseHeaderBytes: maxHeaderBytes,
		ReadBufferSize:         readBufferSize,
		WriteBufferSize:        writeBufferSize,
		ForceAttemptHTTP2:      true,
		// Model servers' SSE is small and must not be held back by gzip buffering.
		DisableCompression: true,
	}
	if plain {
		t.DialContext = dialConn(dial)
	} else {
		t.DialTLSContext = dialTLS(t, dial)
	}
	return t
}

// New builds a pool for every backend of the catalog.
func New(c *catalog.Catalog, opt Options) *Pool {
	opt.ConnectTimeout = cmp.Or(opt.ConnectTimeout, 10*time.Second)
	opt.HeaderTimeout = cmp.Or(opt.HeaderTimeout, 120*time.Second)
	opt.FailureThreshold = cmp.Or(opt.FailureThreshold, 3)
	opt.OpenFor = cmp.Or(opt.OpenFor, 5*time.Second)
	if opt.Now == nil {
		opt.Now = time.Now
	}
	p := &Pool{opt: opt, backends: make(map[string]*backend)}
	for _, m := range c.Models {
		for _, b := range m.Backends {
			if _, ok := p.backends[b.Name]; ok {
				continue
			}
			be := &backend{
				cfg: b,
				header: http.Header{
					"Content-Type": {"application/json"},
					"Accept":       {"application/json, text/event-stream"},
					"User-Agent":   {"kiln-gateway"},
				},
			}
			if src := opt.Tokens[b.APIKeyEnv]; b.APIKeyEnv != "" && src != nil {
				be.token = src
			} else if b.APIKeyEnv != "" && opt.Getenv != nil {
				if k := opt.Getenv(b.APIKeyEnv); k != "" {
					be.header.Set("Authorization", "Bearer "+k)
				}
			}
			if base, err := url.Parse(strings.TrimSuffix(b.URL, "/")); err == nil {
				be.base = *base // catalog.Parse refuses any other; a request without one fails
				// An empty port ("h:") is the scheme's, and the Host header does not name it.
				be.base.Host = strings.TrimSuffix(base.Host, ":")
			}
			be.transport = newTransport(opt, be.base.Scheme == "http")
			p.backends[b.Name] = be
		}
	}
	return p
}

// Call is one request to a model's backends.
type Call struct {
	Model *catalog.Model
	Path  string // below the backend's /v1 base, e.g. "/chat/completions"
	// Body builds the request body for the chosen backend (its model name and capabilities differ).
	Body func(catalog.Backend) []byte
	// OrgID is the organization the request is for. A backend's breaker opens on an error
	// status only when more than one organization has seen it (see breaker), so that one
	// organization's requests can never make a backend unavailable to the others.
	OrgID string
}

// Response is a backend's answer whose headers have arrived. The caller must close Body.
type Response struct {
	*http.Response
	Backend *catalog.Backend
	be      *backend // the backend that answered, whose breaker counts what follows
	pool    *Pool
	orgID   string
}

// Failed records a failure that happened after the headers (a broken stream, a body that is not
// what the status promised), so that the backend's breaker counts it. It says the backend itself
// is unhealthy, whoever asked.
func (r *Response) Failed() {
	r.be.breaker.failure(r.pool.opt.Now(), r.pool.opt, failureUnhealthy, "")
}

// StreamStatus records an error a backend sent inside a stream it had answered with 200 (vLLM and
// SGLang report errors they meet once generation started as an error event that names a status):
// the breaker counts it as it counts that status in an answer's headers.
func (r *Response) StreamStatus(status int) {
	if kind, failed := statusFailure(status); failed {
		r.be.breaker.failure(r.pool.opt.Now(), r.pool.opt, kind, r.orgID)
	}
}

// Do POSTs call to a healthy backend of its model and returns once the response headers arrive.
// A failure before any byte reached a backend is retried once on another healthy backend; nothing
// else is retried. Statuses are returned as they are, and the caller decides what the client sees;
// the breaker counts refused, reset and timed-out connections, 502, 503 and 504 against the
// backend, and 429 and other 5xx only once two organizations have seen them (501, "not
// implemented", is an answer about the request, never a failure). Each request is named by a
// random X-Request-Id, and an answer that echoes another id fails as the backend's error
// (requestIDHeader).
func (p *Pool) Do(ctx context.Context, call Call) (*Response, error) {
	now := p.opt.Now()
	first := p.pick(call.Model, now, "")
	if first == nil {
		return nil, ErrUnavailable
	}
	id := requestIDPrefix + rand.Text() // random: the id may reach the client in the answer's id
	resp, sent, err := p.send(ctx, first, call, id)
	if err == nil {
		return resp, nil
	}
	if sent || ctx.Err() != nil {
		return nil, err
	}
	second := p.pick(call.Model, p.opt.Now(), first.cfg.Name)
	if second == nil {
		return nil, err
	}
	resp, _, err = p.send(ctx, second, call, id)
	return resp, err
}

// pick chooses the next healthy backend in round-robin order, skipping the named one.
func (p *Pool) pick(model *catalog.Model, now time.Time, skip string) *backend {
	n := len(model.Backends)
	start := int(p.next.Add(1) % uint64(n))
	for i := range n {
		b := model.Backends[(start+i)%n]
		if b.Name == skip {
			continue
		}
		be := p.backends[b.Name]
		if be != nil && be.breaker.allow(now) {
			return be
		}
	}
	return nil
}

func (p *Pool) send(ctx context.Context, be *backend, call Call, id string) (*Response, bool, error) {
	resp, sent, err := be.roundTrip(ctx, call.Path, call.Body, id)
	if err != nil {
		if ctx.Err() == nil {
			be.breaker.failure(p.opt.Now(), p.opt, failureUnhealthy, call.OrgID)
		} else {
			be.breaker.abandon() // the caller left: this says nothing of the backend
		}
		return nil, sent, &Error{Backend: be.cfg.Name, Err: err}
	}
	be.refused(resp.StatusCode)
	if kind, failed := statusFailure(resp.StatusCode); failed {
		be.breaker.failure(p.opt.Now(), p.opt, kind, call.OrgID)
	} else {
		be.breaker.success()
	}
	return &Response{Response: resp, Backend: &be.cfg, be: be, pool: p, orgID: call.OrgID}, true, nil
}

// statusFailure classifies a backend's status for its breaker. 502, 503 and 504 come from the
// server (or a proxy in front of it) about itself: unhealthy whoever asked. 429 and the other
// 5xx may be about the request (qwen3-32b on vLLM answers some tool_choice values with 500):
// they count only across organizations. 501 is vLLM's "not implemented" for a feature the request
// asked for, and 4xx are the request's own errors: the backend is working.
func statusFailure(status int) (failureKind, bool) {
	switch {
	case status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout:
		return failureUnhealthy, true
	case status == http.StatusNotImplemented:
		return 0, false
	case status >= 500 || status == http.StatusTooManyRequests:
		return failureAnswered, true
	}
	return 0, false
}

// roundTrip sends a request through the backend's transport and returns once the response
// headers have arrived. sent reports whether any byte of the request may have reached the
// backend: over a conn, whether any left on it; otherwise whether the trace's
// WroteHeaders came, which it does once the header lines are in the connection's write buffer,
// before any of them can have left. A request that nothing of left on a kept-alive connection is
// sent once more: the connection was broken (a backend closes one as it answers early, and
// another request may take it from the pool before the Transport sees that). The Transport
// itself sends again only what it wrote nothing of from a request that fits its write buffer.
func (be *backend) roundTrip(ctx context.Context, path string, body func(catalog.Backend) []byte, id string) (*http.Response, bool, error) {
	var b *requestBody
	if payload := body(be.cfg); len(payload) > 0 {
		b = &requestBody{full: payload}
		// The transport asks for the body again only before the response headers arrive.
		defer b.forget()
	}
	for first := true; ; first = false {
		resp, sent, stale, err := be.send(ctx, path, b, id)
		if err == nil || sent || !stale || !first || ctx.Err() != nil {
			return resp, sent, err
		}
	}
}

// send is one attempt of roundTrip, for the request named id. stale: it failed on a kept-alive
// connection before anything of it left.
func (be *backend) send(ctx context.Context, path string, b *requestBody, id string) (resp *http.Response, sent, stale bool, err error) {
	a := new(attempt)
	a.trace.GotConn = func(info httptrace.GotConnInfo) {
		if c, ok := info.Conn.(*conn); ok {
			a.unsure.Store(!c.start(ctx))
			a.conn.Store(c)
			a.reused.Store(info.Reused)
		}
	}
	a.trace.PutIdleConn = func(err error) {
		if c := a.conn.Load(); c != nil && err == nil {
			c.answered()
		}
	}
	a.trace.WroteHeaders = func() { a.wroteHeaders.Store(true) }
	// Built from the parsed base: http.NewRequestWithContext would parse the URL again on every
	// request (4.1k instructions against 0.8k, counted by callgrind).
	u := be.base
	u.Path += path
	if u.RawPath != "" {
		u.RawPath += path // a base written with escapes keeps them
	}
	req := (&http.Request{Method: http.MethodPost, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: be.headerFor(id)}).
		WithContext(httptrace.WithClientTrace(ctx, &a.trace))
	if b != nil {
		a.trace.WroteRequest = b.written
		req.Body, req.GetBody, req.ContentLength = b.reader(), b.again, int64(len(b.full))
	}
	resp, err = be.transport.RoundTrip(req)
	if err != nil {
		if c := a.conn.Load(); c != nil {
			return nil, c.sent(), !c.sent() && a.reused.Load(), err
		}
		return nil, a.wroteHeaders.Load(), false, err
	}
	if a.unsure.Load() {
		// The caller left before the connection was known to hold nothing of another answer.
		err = context.Cause(ctx)
	} else if got := resp.Header.Get(requestIDHeader); got != id && (be.cfg.EchoesRequestID || strings.HasPrefix(got, requestIDPrefix)) {
		err = errAnotherAnswer
	}
	if err != nil {
		// Whatever follows on the connection is suspect too: it goes, also when the answer had no
		// body and the Transport has pooled it already. Then another request may have been written
		// on it meanwhile, and fails with the backend's error (sent, so not retried); an answer
		// refused here has a body in practice, and a backend that answers with another request's
		// id has earned the doubt. Without a conn (HTTP/2) the backend's idle connections go.
		resp.Body.Close()
		if c := a.conn.Load(); c != nil {
			c.Close()
		} else {
			be.transport.CloseIdleConnections()
		}
		return nil, true, false, err
	}
	resp.Body = &responseBody{body: resp.Body}
	return resp, true, false, nil
}

// attempt is one send's trace and what its hooks learn of the connection, in one allocation.
type attempt struct {
	trace        httptrace.ClientTrace
	wroteHeaders atomic.Bool
	reused       atomic.Bool
	unsure       atomic.Bool // the caller left while the request waited to start on conn
	conn         atomic.Pointer[conn]
}

// responseBody is a backend's response body. Read to its end, it leaves its connection to the
// Transport's pool. Closed before its end, it reads on for a moment, and the connection stays if
// the end comes in that time: a stream's chunked encoding ends a moment after its [DONE] event,
// which is where a relay stops reading. A body whose end does not come soon (a stream cut in its
// middle), or that is closed while another goroutine reads it, is closed before its end: the
// Transport closes the connection (on HTTP/2 it resets the stream), which ends the read and stops
// the backend.
type responseBody struct {
	body io.ReadCloser

	mu      sync.Mutex
	reading bool // a Read is under way
	ended   bool // a Read met the end
	closed  bool
}

// drainFor and maxDrain bound what a closed body still reads to keep its connection. (The
// Transport alone closes the connection of a body closed before its end.)
const (
	drainFor = 100 * time.Millisecond
	maxDrain = 4 << 10
)

func (b *responseBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	}
	b.reading = true
	b.mu.Unlock()
	n, err := b.body.Read(p)
	b.mu.Lock()
	b.reading = false
	b.ended = b.ended || err == io.EOF
	b.mu.Unlock()
	return n, err
}

func (b *responseBody) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	reading, ended := b.reading, b.ended
	b.mu.Unlock()
	if !reading && !ended {
		// The Transport's body may be closed while it is read: that ends the read.
		cut := time.AfterFunc(drainFor, func() { b.body.Close() })
		_, _ = io.CopyN(io.Discard, b.body, maxDrain)
		cut.Stop()
	}
	return b.body.Close()
}

// requestBody is a request's body, which lets go of its bytes once they are sent. The transport
// keeps the request, with its body, until the response body is read to its end, which for a
// stream is when the stream ends; the bytes themselves are needed only until they are written.
//
// What the transport reads is a *bytes.Reader behind io.NopCloser, a body it knows to be in
// memory: it then writes the header lines and the body together, in one system call and one
// packet, where for a reader of its own it sends the header lines first.
type requestBody struct {
	full    []byte                       // the whole body, for a retry, until forget
	cur     atomic.Pointer[bytes.Reader] // the copy being sent
	retried atomic.Bool                  // again was called: copies are no longer emptied
}

// reader returns a new copy of the body to send.
func (r *requestBody) reader() io.ReadCloser {
	br := bytes.NewReader(r.full)
	r.cur.Store(br)
	return io.NopCloser(br)
}

// again is the request's GetBody: the transport retries a request on a fresh connection when a
// kept-alive one turned out to be closed before anything was written.
func (r *requestBody) again() (io.ReadCloser, error) {
	if r.full == nil {
		return nil, errors.New("request body already sent")
	}
	r.retried.Store(true)
	return r.reader(), nil
}

// written is the trace's WroteRequest: the transport is done with the copy it was sending (its
// writer calls it after the write, so nothing reads the copy any more), which lets go of the bytes.
// After a retry it does nothing: the HTTP/2 transport may start the retry before the first
// attempt's writer has called it, and the copy in cur is then the retry's, still being read.
func (r *requestBody) written(httptrace.WroteRequestInfo) {
	if r.retried.Load() {
		return
	}
	if br := r.cur.Load(); br != nil {
		br.Reset(nil)
	}
}

// forget drops the body kept for retries.
func (r *requestBody) forget() { r.full = nil }

// failureKind is what a failure says about a backend.
type failureKind int

const (
	// failureUnhealthy is evidence against the backend itself: a refused, reset or timed-out
	// connection, a broken stream, 502, 503 or 504.
	failureUnhealthy failureKind = iota
	// failureAnswered is an error status the backend chose to send (500, 429): it may be about
	// the request that drew it, so it counts only once a second organization has seen one.
	failureAnswered
)

// breaker is a consecutive-failure circuit breaker that cannot be opened by one tenant: closed
// until FailureThreshold failures in a row, of which at least one says the backend is unhealthy or
// which two organizations have drawn; then open for OpenFor; then half-open: one trial request
// decides. A success anywhere closes it. A failed trial opens it again only on the same evidence
// gathered afresh, so one organization whose requests keep failing cannot keep the backend from
// the others.
type breaker struct {
	mu        sync.Mutex
	failures  int
	unhealthy bool      // the run of failures holds a failureUnhealthy
	orgs      [2]string // the first two organizations that drew failureAnswered in this run
	nOrgs     int
	openUntil time.Time
	trial     bool // a half-open trial is in flight
}

func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.IsZero() {
		return true
	}
	if now.Before(b.openUntil) || b.trial {
		return false
	}
	b.trial = true
	return true
}

func (b *breaker) success() {
	b.mu.Lock()
	b.failures, b.unhealthy, b.nOrgs = 0, false, 0
	b.openUntil, b.trial = time.Time{}, false
	b.mu.Unlock()
}

func (b *breaker) abandon() {
	b.mu.Lock()
	b.trial = false
	b.mu.Unlock()
}

func (b *breaker) failure(now time.Time, opt Options, kind failureKind, orgID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	switch {
	case kind == failureUnhealthy:
		b.unhealthy = true
	case b.nOrgs == 0 || (b.nOrgs == 1 && b.orgs[0] != orgID):
		b.orgs[b.nOrgs] = orgID
		b.nOrgs++
	}
	evidence := b.unhealthy || b.nOrgs >= 2
	wasTrial := b.trial
	b.trial = false
	if evidence && (wasTrial || b.failures >= opt.FailureThreshold) {
		b.openUntil = now.Add(opt.OpenFor)
		// A failed trial opens it again only on evidence of its own.
		b.unhealthy, b.nOrgs = false, 0
	}
}
