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
	x, checked := g.admit(w, r, ep)
	if x == nil {
		return
	}
	// From here on the request owns a slot: whatever happens, it is settled — the slot and its
	// reservation released, what was generated debited, the event recorded — before the client
	// sees the end of its answer, or, when the answer ends without the gateway writing it (a
	// client that left), by end.
	defer x.end()
	if checked {
		x.forward(x.fenced)
	}
	x.abortIfGone()
}

// exchange is one admitted inference request on its way through the gateway.
type exchange struct {
	g      *Gateway
	w      http.ResponseWriter
	reqCtx context.Context // the client's request: cancelled when it leaves
	fenced context.Context // reqCtx, also cancelled with causeSlotLost when the lease lapses
	ep     *endpoint
	req    *request

	mu      sync.Mutex // guards lease, renewer, fence and settled: renewals run on a timer
	lease   store.Lease
	renewer *time.Timer
	fence   *time.Timer
	settled bool
	lost    context.CancelCauseFunc // cancels fenced

	concluded bool             // conclude ran
	st        store.Settlement // what conclude settled, or end retries
	committed bool             // the settlement committed
	result    store.SettleResult

	event usage.Event
	meter meter
}

// fail answers with a gateway error before anything was streamed; the request is settled first.
func (x *exchange) fail(e *apiError) {
	x.event.HTTPStatus = e.status
	x.conclude()
	writeError(x.w, e)
}

// badGateway answers with the plain-text 502 of a backend failure; the request is settled first.
func (x *exchange) badGateway(reason string) {
	x.event.HTTPStatus = http.StatusBadGateway
	x.conclude()
	badGateway(x.w, reason)
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
	var ue *upstream.Error
	if errors.As(err, &ue) {
		x.event.Backend = ue.Backend // the backend called, also when the client left meanwhile
	}
	switch {
	case x.requestCtxDone():
		x.event.Status = usage.StatusClientDisconnected
		x.event.HTTPStatus = 499 // nobody is left to read a status; 499 is nginx's word for it
		x.meter.billable = true  // the backend may have started: bill the prompt, estimated
	case slotLost(ctx):
		x.event.Status = usage.StatusSlotLost
		x.fail(errSlotLost) // nothing was delivered: nothing is billed
	case errors.Is(err, upstream.ErrUnavailable):
		x.fail(errUnavailable(x.req.model.ID))
	default:
		x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend request failed", slog.String("generation_id", x.event.GenerationID), slog.String("backend", x.event.Backend), slog.String("error", err.Error()))
		x.badGateway("the model backend was unreachable or did not answer in time.")
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
		x.badGateway("the model backend returned an error.")
	}
	return false
}

// requestCtxDone reports whether the client left (its request was cancelled) rather than our own
// deadline passing.
func (x *exchange) requestCtxDone() bool {
	return errors.Is(x.reqCtx.Err(), context.Canceled)
}

// upstreamMessage extracts a model server's error message: vLLM's {"object":"error","message"},
// OpenAI's {"error":{"message"}}, or FastAPI's {"detail": ...}; otherwise the text itself.
func upstreamMessage(body io.Reader) string {
	raw, _ := io.ReadAll(io.LimitReader(body, 64<<10))
	fields, err := openai.ParseObject(nil, raw)
	if err == nil {
		if f, ok := openai.Lookup(raw, fields, "message"); ok {
			if s, ok := openai.Unquote(f.Value(raw)); ok && s != "" {
				return abbreviateText(s, 500) // a validation error may quote the whole request
			}
		}
		if f, ok := openai.Lookup(raw, fields, "error"); ok {
			ev := f.Value(raw)
			if ef, err := openai.ParseObject(nil, ev); err == nil {
				if mf, ok := openai.Lookup(ev, ef, "message"); ok {
					if s, ok := openai.Unquote(mf.Value(ev)); ok && s != "" {
						return abbreviateText(s, 500)
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

func abbreviateText(s string, max int) string { return clip(s, max) }
