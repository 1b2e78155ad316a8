// Package upstream talks to model servers: it keeps a pool of connections per backend (its own
// HTTP/1.1 connections for http:// backends, net/http's Transport for https://), tracks each
// backend's health with a circuit breaker, picks a healthy backend for a model, retries on
// another backend only when nothing reached the first, and cancels the backend request the
// moment the caller's context ends.
package upstream

import (
	"bytes"
	"context"
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

// Pool holds the connections to every backend.
type Pool struct {
	opt      Options
	backends map[string]*backend
	next     atomic.Uint64
}

type backend struct {
	cfg    catalog.Backend
	base   string
	header http.Header // every request's header: shared, and never written after New
	// conns sends the requests to a backend on http://, transport to one on https://; neither
	// follows redirects: a model server's answer is the answer, a redirect included.
	conns     *conns
	transport *http.Transport
	breaker   breaker
	token     TokenSource // the bearer token, when read at run time; nil when in header
}

// newTransport is what https:// backends are sent through (HTTP/2 when they offer it).
func newTransport(opt Options) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: opt.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   maxIdleConns,
		IdleConnTimeout:       idleConnTimeout,
		ResponseHeaderTimeout: opt.HeaderTimeout,
		TLSHandshakeTimeout:   opt.ConnectTimeout,
		ForceAttemptHTTP2:     true,
		// Model servers' SSE is small and must not be held back by gzip buffering.
		DisableCompression: true,
	}
}

// New builds a pool for every backend of the catalog.
func New(c *catalog.Catalog, opt Options) *Pool {
	if opt.ConnectTimeout == 0 {
		opt.ConnectTimeout = 10 * time.Second
	}
	if opt.HeaderTimeout == 0 {
		opt.HeaderTimeout = 120 * time.Second
	}
	if opt.FailureThreshold == 0 {
		opt.FailureThreshold = 3
	}
	if opt.OpenFor == 0 {
		opt.OpenFor = 5 * time.Second
	}
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
				cfg:  b,
				base: strings.TrimSuffix(b.URL, "/"),
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
			if u, err := url.Parse(be.base); err == nil && u.Scheme == "http" && u.User == nil && u.RawQuery == "" {
				be.conns = newConns(u, be.header, opt)
			} else {
				be.transport = newTransport(opt)
			}
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
	Backend catalog.Backend
	pool    *Pool
	orgID   string
}

// Failed records a failure that happened after the headers (a broken stream, a body that is not
// what the status promised), so that the backend's breaker counts it. It says the backend itself
// is unhealthy, whoever asked.
func (r *Response) Failed() {
	if be := r.pool.backends[r.Backend.Name]; be != nil {
		be.breaker.failure(r.pool.opt.Now(), r.pool.opt, failureUnhealthy, "")
	}
}

// StreamStatus records an error a backend sent inside a stream it had answered with 200 (vLLM and
// SGLang report errors they meet once generation started as an error event that names a status):
// the breaker counts it as it counts that status in an answer's headers.
func (r *Response) StreamStatus(status int) {
	be := r.pool.backends[r.Backend.Name]
	if be == nil {
		return
	}
	if kind, failed := statusFailure(status); failed {
		be.breaker.failure(r.pool.opt.Now(), r.pool.opt, kind, r.orgID)
	}
}

// Do POSTs call to a healthy backend of its model and returns once the response headers arrive.
// A failure before any byte reached a backend is retried once on another healthy backend; nothing
// else is retried. Statuses are returned as they are, and the caller decides what the client sees;
// the breaker counts refused, reset and timed-out connections, 502, 503 and 504 against the
// backend, and 429 and other 5xx only once two organizations have seen them (501, "not
// implemented", is an answer about the request, never a failure).
func (p *Pool) Do(ctx context.Context, call Call) (*Response, error) {
	now := p.opt.Now()
	first := p.pick(call.Model, now, "")
	if first == nil {
		return nil, ErrUnavailable
	}
	resp, sent, err := p.send(ctx, first, call)
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
	resp, _, err = p.send(ctx, second, call)
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

func (p *Pool) send(ctx context.Context, be *backend, call Call) (*Response, bool, error) {
	var resp *http.Response
	var sent bool
	var err error
	if be.conns != nil {
		resp, sent, err = be.conns.roundTrip(ctx, call.Path, be.authLine(), call.Body(be.cfg))
	} else {
		resp, sent, err = be.roundTrip(ctx, call.Path, call.Body)
	}
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
	return &Response{Response: resp, Backend: be.cfg, pool: p, orgID: call.OrgID}, true, nil
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

// roundTrip sends a request through the backend's transport.
func (be *backend) roundTrip(ctx context.Context, path string, body func(catalog.Backend) []byte) (*http.Response, bool, error) {
	var sent atomic.Bool
	trace := &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }}
	var b *requestBody
	if payload := body(be.cfg); len(payload) > 0 {
		b = &requestBody{full: payload}
		trace.WroteRequest = b.written
		// The transport asks for the body again only before the response headers arrive.
		defer b.forget()
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, be.base+path, nil)
	if err != nil {
		return nil, false, err
	}
	req.Header = be.headerFor()
	if b != nil {
		req.Body, req.GetBody, req.ContentLength = b.reader(), b.again, int64(len(b.full))
	}
	resp, err := be.transport.RoundTrip(req)
	return resp, sent.Load(), err
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

// Healthy reports whether the named backend's breaker lets requests through at now.
func (p *Pool) Healthy(name string, now time.Time) bool {
	be := p.backends[name]
	return be != nil && be.breaker.peek(now)
}

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

func (b *breaker) peek(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.openUntil.IsZero() || (!now.Before(b.openUntil) && !b.trial)
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
