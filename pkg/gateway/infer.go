package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// newGenerationID returns "gen-" and a ULID: unique, sortable by time, made before the backend
// is called so that every response can carry it.
func newGenerationID() string { return "gen-" + ulid.Make().String() }

// infer serves the two inference endpoints, in the contract's order of checks.
//
// An open stream waits for its backend at the bottom of ServeHTTP → infer → forward → relay →
// pump → the decoder → the transport, on the goroutine that serves the client's connection, and
// that goroutine's stack is the largest thing an idle stream holds. The functions of ours in the
// chain keep small frames: the stack then never needs more than 8 KiB, and should something grow
// it (a deep store call), the collector shrinks it back while the stream waits, as it halves a
// stack less than a quarter used. Work that needs room (admission, checks, error answers, the end
// of a stream) is in functions that return before the wait.
func (g *Gateway) infer(w http.ResponseWriter, r *http.Request, ep *endpoint) {
	if r.Method != http.MethodPost {
		notPost(w, r)
		return
	}
	x, body := g.admit(w, r, ep)
	if x == nil {
		return
	}
	// From here on the request owns a slot: whatever happens, settle releases it, debits what
	// was generated and records the event.
	defer x.end()
	if x.validate(body) {
		x.forward(x.reqCtx)
	}
}

// admit runs steps 1 to 6 of the contract: maintenance, body size, key, organization, credits and
// an in-flight slot. It returns the admitted exchange and the request body, or nil when it has
// answered the client itself.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, ep *endpoint) (*exchange, []byte) {
	ctx := r.Context()
	started := g.opt.Now()

	// 1. Maintenance.
	if e := g.checkMaintenance(ctx); e != nil {
		writeError(w, e)
		return nil, nil
	}
	// 2. Body size. The body is read whole before authentication, as the order requires; the
	// limit bounds what an anonymous client can make us hold.
	body, e := g.readBody(w, r)
	if e != nil {
		writeError(w, e)
		return nil, nil
	}
	// 3, 4. Key and organization.
	p, e := g.authenticate(ctx, r)
	if e != nil {
		writeError(w, e)
		return nil, nil
	}
	genID := newGenerationID()
	w.Header().Set(GenerationHeader, genID)
	if p.OrgStatus == store.OrgSuspended {
		writeError(w, errSuspended)
		return nil, nil
	}
	// 5, 6. Credits and an in-flight slot, in one store call.
	lease, err := g.opt.Store.Admit(ctx, store.AdmitRequest{OrgID: p.OrgID, HolderID: genID, Now: started, TTL: g.opt.LeaseTTL})
	if err != nil {
		g.opt.Metrics.Refused(err, p.OrgID, started)
		switch {
		case errors.Is(err, store.ErrSuspended):
			writeError(w, errSuspended)
		case errors.Is(err, store.ErrInsufficientCredits):
			writeError(w, errNoCredits)
		case errors.Is(err, store.ErrSlotsFull):
			writeError(w, errRateLimited(p.MaxInFlight))
		case errors.Is(err, store.ErrNotFound):
			writeError(w, errBadKey) // the organization was deleted under a cached key
		default:
			g.log.LogAttrs(ctx, slog.LevelError, "admission failed", slog.String("generation_id", genID), slog.String("org_id", p.OrgID), slog.String("error", err.Error()))
			writeError(w, errStoreDown)
		}
		return nil, nil
	}

	x := &exchange{
		g:      g,
		w:      w,
		reqCtx: ctx,
		ep:     ep,
		lease:  lease,
		event: usage.Event{
			Version:      usage.SchemaVersion,
			GenerationID: genID,
			OrgID:        p.OrgID,
			KeyID:        p.KeyID,
			Endpoint:     ep.name,
			StartedAt:    started,
			Status:       usage.StatusRejected,
		},
	}
	g.renewLeases(x)
	g.admitted.Add(1)
	g.unsettled.Store(genID, &pending{orgID: p.OrgID, done: make(chan struct{})})
	return x, body
}

// end settles the exchange once the handler is done with it: on the handler's goroutine, or in
// the background when the gateway is configured so.
func (x *exchange) end() {
	g := x.g
	if !g.opt.SettleInBackground {
		x.settle(x.reqCtx)
		return
	}
	g.settling.Add(1)
	g.settlers.run(x)
}

// validate runs the endpoint checks, step 7, and reports whether the request may be forwarded;
// when not, the client has its error.
func (x *exchange) validate(body []byte) bool {
	req, modelID, e := x.g.check(x.ep, body)
	x.event.Model = modelID
	x.event.Stream = req.stream
	if e != nil {
		x.fail(e)
		return false
	}
	x.req = &req
	return true
}

// readBody reads the request body under the size limit.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > g.opt.MaxBody {
		return nil, errTooLarge(g.opt.MaxBody)
	}
	n := r.ContentLength
	if n < 0 || n > 64<<10 {
		n = 64 << 10 // grow as needed; a lying Content-Length cannot make us allocate the limit
	}
	buf := make([]byte, 0, n+1)
	body, err := readAllInto(buf, http.MaxBytesReader(w, r.Body, g.opt.MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errTooLarge(g.opt.MaxBody)
		}
		return nil, invalid("", "", "The request body could not be read: the connection ended before the body did.")
	}
	return body, nil
}

func readAllInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// exchange is one admitted inference request on its way through the gateway.
type exchange struct {
	g      *Gateway
	w      http.ResponseWriter
	reqCtx context.Context
	ep     *endpoint
	req    *request

	mu      sync.Mutex // guards lease, renewer and settled: renewals run on a timer
	lease   store.Lease
	renewer *time.Timer
	settled bool

	event usage.Event
	meter meter
}

// fail answers with a gateway error before anything was streamed.
func (x *exchange) fail(e *apiError) {
	x.event.HTTPStatus = e.status
	writeError(x.w, e)
}

// forward sends the request to a backend (step 8) and relays the answer.
func (x *exchange) forward(ctx context.Context) {
	x.event.Status = usage.StatusUpstreamError
	ctx, cancel := x.backendContext(ctx)
	defer cancel()
	resp := x.call(ctx)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	if !x.answered(ctx, resp) {
		return
	}
	if x.req.stream {
		x.relay(ctx, resp)
	} else {
		x.respond(ctx, resp)
	}
}

// call sends the request to a backend and returns its response, or nil when there is none (the
// client then has its answer).
func (x *exchange) call(ctx context.Context) *upstream.Response {
	resp, err := x.g.opt.Upstream.Do(ctx, x.req.model, x.ep.path, x.req.forward)
	// The parsed request was for building the forwarded body; a stream need not hold it.
	x.req.fields, x.req.options = nil, nil
	if err != nil {
		x.unanswered(ctx, err)
		return nil
	}
	return resp
}

// backendContext is the context of the backend call. On Lambda the request has a deadline; the
// call stops early enough to settle before it.
func (x *exchange) backendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-x.g.opt.SettleReserve))
	}
	return ctx, func() {}
}

// unanswered handles a backend call that got no response headers.
func (x *exchange) unanswered(ctx context.Context, err error) {
	x.meter.promptEstimate = func() int64 { return estimatePromptTokens(x.ep.chat, x.req.body) }
	switch {
	case x.requestCtxDone():
		x.event.Status = usage.StatusClientDisconnected
		x.event.HTTPStatus = 499 // nobody is left to read a status; 499 is nginx's word for it
		x.meter.billable = true  // the backend may have started: bill the prompt, estimated
	case errors.Is(err, upstream.ErrUnavailable):
		x.fail(errUnavailable(x.req.model.ID))
	case x.deadlinePassed(ctx):
	default:
		var ue *upstream.Error
		if errors.As(err, &ue) {
			x.event.Backend = ue.Backend
		}
		x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend request failed", slog.String("generation_id", x.event.GenerationID), slog.String("backend", x.event.Backend), slog.String("error", err.Error()))
		x.event.HTTPStatus = http.StatusBadGateway
		badGateway(x.w, "the model backend was unreachable or did not answer in time.")
	}
}

// answered records which backend answered and reports whether its status lets the answer
// through; when not, the client has its error.
func (x *exchange) answered(ctx context.Context, resp *upstream.Response) bool {
	x.event.Backend = resp.Backend.Name
	x.meter.exactPerChunk = resp.Backend.ContinuousUsage
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return true
	case s == http.StatusBadRequest || s == http.StatusRequestEntityTooLarge || s == http.StatusUnprocessableEntity:
		x.fail(upstreamInvalid(upstreamMessage(resp.Body)))
	case s == http.StatusTooManyRequests:
		x.fail(errUnavailable(x.req.model.ID))
	default:
		x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend answered with an error", slog.String("generation_id", x.event.GenerationID), slog.String("backend", x.event.Backend), slog.Int("backend_status", s))
		x.event.HTTPStatus = http.StatusBadGateway
		badGateway(x.w, "the model backend returned an error.")
	}
	return false
}

// requestCtxDone reports whether the client left (its request was cancelled) rather than our own
// deadline passing.
func (x *exchange) requestCtxDone() bool {
	return errors.Is(x.reqCtx.Err(), context.Canceled)
}

// renewLeases renews the exchange's lease every third of its TTL until settlement, so that a
// long stream keeps its slot and a crashed one loses it. The timer is created under x.mu, which
// every renewal takes before it touches the timer, and a renewal that finds the exchange settled
// does not re-arm it: no renewal outlives settlement.
func (g *Gateway) renewLeases(x *exchange) {
	every := g.opt.LeaseTTL / 3
	x.mu.Lock()
	defer x.mu.Unlock()
	x.renewer = time.AfterFunc(every, func() { g.renewLease(x, every) })
}

func (g *Gateway) renewLease(x *exchange, every time.Duration) {
	x.mu.Lock()
	lease, settled := x.lease, x.settled
	x.mu.Unlock()
	if settled {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	renewed, err := g.opt.Store.Renew(ctx, lease, g.opt.Now(), g.opt.LeaseTTL)
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelWarn, "lease renewal failed", slog.String("generation_id", lease.HolderID), slog.String("org_id", lease.OrgID), slog.String("error", err.Error()))
		if errors.Is(err, store.ErrLeaseLost) {
			return // the slot is gone; renewing again cannot bring it back
		}
	} else {
		x.lease = renewed
	}
	if !x.settled {
		x.renewer.Reset(every)
	}
}

// settle ends the exchange: the slot is released, the cost debited once, the event recorded and
// published. It runs on a context that survives the client's departure.
func (x *exchange) settle(reqCtx context.Context) {
	g := x.g
	x.mu.Lock()
	x.settled = true
	x.renewer.Stop()
	x.mu.Unlock()
	ctx := context.WithoutCancel(reqCtx)
	now := g.opt.Now()
	x.event.DurationMillis = now.Sub(x.event.StartedAt).Milliseconds()
	if x.req != nil {
		if err := x.meter.apply(&x.event, x.req.model.Pricing); err != nil {
			g.log.LogAttrs(ctx, slog.LevelError, "cost not computable", slog.String("generation_id", x.event.GenerationID), slog.String("error", err.Error()))
		}
	}
	x.mu.Lock()
	lease := x.lease
	x.mu.Unlock()
	res, err := g.settleRetrying(reqCtx, store.Settlement{Lease: lease, Event: x.event, Now: now})
	attrs := []slog.Attr{
		slog.String("generation_id", x.event.GenerationID),
		slog.String("org_id", x.event.OrgID),
		slog.String("key_id", x.event.KeyID),
		slog.String("model", x.event.Model),
		slog.String("endpoint", x.event.Endpoint),
		slog.Bool("stream", x.event.Stream),
		slog.String("status", string(x.event.Status)),
		slog.Int("http_status", x.event.HTTPStatus),
		slog.Int64("prompt_tokens", x.event.PromptTokens),
		slog.Int64("cached_tokens", x.event.CachedTokens),
		slog.Int64("completion_tokens", x.event.CompletionTokens),
		slog.String("cost", x.event.Cost.String()),
		slog.Bool("estimated", x.event.Estimated),
		slog.Int64("ttft_ms", x.event.TTFTMillis),
		slog.Int64("duration_ms", x.event.DurationMillis),
		slog.String("backend", x.event.Backend),
	}
	if err != nil {
		// What the log line holds is all there is left of this request's bill: it carries every
		// field of the event, so that it can be replayed into the store by hand.
		g.log.LogAttrs(ctx, slog.LevelError, "settlement abandoned", append(attrs, slog.String("error", err.Error()))...)
		g.settled(x.event.GenerationID)
		return
	}
	if res.AlreadyApplied {
		attrs = append(attrs, slog.Bool("already_applied", true))
	}
	g.log.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
	g.opt.Metrics.Request(x.event, now)
	g.settled(x.event.GenerationID)
	if g.opt.Publish != nil && !res.AlreadyApplied {
		g.opt.Publish(ctx, x.event)
	}
}

// pending is a request admitted by this process and not yet settled.
type pending struct {
	orgID string
	done  chan struct{} // closed once settled (or abandoned)
}

// settled marks a generation as settled for anyone waiting on it.
func (g *Gateway) settled(generationID string) {
	if v, ok := g.unsettled.LoadAndDelete(generationID); ok {
		close(v.(*pending).done)
		g.admitted.Add(-1)
	}
}

// awaitSettlement waits, for at most max, until a generation this process is still settling has
// been settled, so that GET /v1/generation answers from the moment the response ended. Only the
// organization's own requests are waited for.
func (g *Gateway) awaitSettlement(ctx context.Context, orgID, generationID string, max time.Duration) {
	v, ok := g.unsettled.Load(generationID)
	if !ok || v.(*pending).orgID != orgID {
		return
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-v.(*pending).done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// settleRetrying applies a settlement, retrying with backoff while the store fails: a request
// the client received must not go unbilled because the store blinked. Settle is idempotent, so a
// retry after a lost answer changes nothing. It gives up at SettleRetryFor, or on Lambda shortly
// before the invocation's deadline.
func (g *Gateway) settleRetrying(reqCtx context.Context, st store.Settlement) (store.SettleResult, error) {
	giveUp := time.Now().Add(g.opt.SettleRetryFor)
	if dl, ok := reqCtx.Deadline(); ok && dl.Add(-time.Second).Before(giveUp) {
		giveUp = dl.Add(-time.Second)
	}
	base := context.WithoutCancel(reqCtx)
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		deadline := time.Now().Add(10 * time.Second)
		if giveUp.Before(deadline) && giveUp.After(time.Now()) {
			deadline = giveUp
		}
		ctx, cancel := context.WithDeadline(base, deadline)
		res, err := g.opt.Store.Settle(ctx, st)
		cancel()
		if err == nil || time.Now().Add(backoff).After(giveUp) {
			return res, err
		}
		g.log.LogAttrs(base, slog.LevelWarn, "settlement failed; retrying",
			slog.String("generation_id", st.Event.GenerationID), slog.Int("attempt", attempt),
			slog.Duration("backoff", backoff), slog.String("error", err.Error()))
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// upstreamMessage extracts a model server's error message: vLLM's {"object":"error","message"},
// OpenAI's {"error":{"message"}}, or FastAPI's {"detail": ...}; otherwise the text itself.
func upstreamMessage(body io.Reader) string {
	raw, _ := io.ReadAll(io.LimitReader(body, 64<<10))
	fields, err := openai.ParseObject(nil, raw)
	if err == nil {
		if f, ok := openai.Lookup(raw, fields, "message"); ok {
			if s, ok := openai.Unquote(f.Value(raw)); ok && s != "" {
				return s
			}
		}
		if f, ok := openai.Lookup(raw, fields, "error"); ok {
			ev := f.Value(raw)
			if ef, err := openai.ParseObject(nil, ev); err == nil {
				if mf, ok := openai.Lookup(ev, ef, "message"); ok {
					if s, ok := openai.Unquote(mf.Value(ev)); ok && s != "" {
						return s
					}
				}
			}
		}
		if f, ok := openai.Lookup(raw, fields, "detail"); ok {
			return "Invalid request: " + abbreviateText(string(f.Value(raw)), 500)
		}
	}
	if len(raw) == 0 {
		return "The model server rejected the request."
	}
	return abbreviateText(string(raw), 500)
}

func abbreviateText(s string, max int) string {
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
