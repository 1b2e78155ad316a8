package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

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
	withheld  bool             // the answer was not given for want of its settlement (withhold)
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
	resp, err := x.g.opt.Upstream.Do(ctx, upstream.Call{Model: x.req.model, Path: x.ep.path, Body: x.req.forward, OrgID: x.event.OrgID})
	if x.req.stream {
		x.meter.n, x.meter.prompts = x.req.choices()
	}
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
	case x.deadlinePassed(ctx):
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
	x.meter.cachedTokens = resp.Backend.CachedTokens
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return true
	case rejects(s):
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		be, ok := parseBackendError(raw)
		if !ok {
			be.message = string(raw)
		}
		be.status = s
		if engineFailure(be.message) {
			resp.StreamStatus(http.StatusInternalServerError)
			_, logged := x.backendMessage(resp, be.message)
			x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend engine failed", slog.String("generation_id", x.event.GenerationID), slog.String("backend", x.event.Backend), slog.Int("backend_status", s), slog.String("backend_message", logged))
			x.badGateway("the model backend failed.")
			return false
		}
		x.refused(ctx, resp, be)
		x.fail(x.refusal(resp, be))
	case s == http.StatusTooManyRequests:
		x.fail(errUnavailable(x.req.model.ID))
	default:
		x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend answered with an error", slog.String("generation_id", x.event.GenerationID), slog.String("backend", x.event.Backend), slog.Int("backend_status", s))
		x.badGateway("the model backend returned an error.")
	}
	return false
}

// maxErrorBody bounds what is read of a backend's error body. vLLM repeats the request in some
// messages, so a body can be as large as the request; its message is read as far as it goes.
const maxErrorBody = 64 << 10

// refused records that the backend refused the request as the request's own fault, and logs the
// backend's message in full, without the request's content. The request is "rejected", as one the
// gateway refuses itself: the backend did what it should, and nothing was generated (what was, on
// a stream, is billed as usual).
func (x *exchange) refused(ctx context.Context, resp *upstream.Response, be backendError) {
	x.event.Status = usage.StatusRejected
	_, logged := x.backendMessage(resp, be.message)
	x.g.log.LogAttrs(ctx, slog.LevelInfo, "backend refused the request",
		slog.String("generation_id", x.event.GenerationID), slog.String("backend", x.event.Backend),
		slog.Int("backend_status", be.status), slog.String("param", be.param), slog.String("backend_message", logged))
}

// refusal is the client's error for a request the backend refused (a 501, "not implemented",
// included): a 400 with the backend's message, cleaned, its param and no code.
func (x *exchange) refusal(resp *upstream.Response, be backendError) *apiError {
	msg, _ := x.backendMessage(resp, be.message)
	e := upstreamInvalid(msg)
	e.body.Param = abbreviateText(be.param, 64)
	return e
}

// backendMessage cleans a backend's message for the client (and for the log) of this exchange:
// the backend's model name, and the stream options the gateway injected and the client did not
// send, must not reach the client.
func (x *exchange) backendMessage(resp *upstream.Response, raw string) (client, logged string) {
	var injected []string
	if x.req.stream {
		for _, k := range [...]string{"continuous_usage_stats", "include_usage", "stream_options"} {
			if !bytes.Contains(x.req.body, []byte(k)) {
				injected = append(injected, k)
			}
		}
	}
	return backendMessage(raw, resp.Backend.Model, x.req.model.ID, injected)
}

// requestCtxDone reports whether the client left (its request was cancelled) rather than our own
// deadline passing.
func (x *exchange) requestCtxDone() bool {
	return errors.Is(x.reqCtx.Err(), context.Canceled)
}

// abbreviateText cuts s to at most max bytes, at a character boundary, marking the cut.
func abbreviateText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// choices reads how many choices a request asks for, for metering a stream by choice: n (1 when
// absent or not a count), and the number of prompts of a completions prompt array of strings or
// of token-id lists (1 otherwise; one list of token ids is one prompt).
func (req *request) choices() (n, prompts int64) {
	n, prompts = 1, 1
	if f, ok := openai.Lookup(req.body, req.fields, "n"); ok {
		if v := smallInt(f.Value(req.body)); v > 0 {
			n = int64(v)
		}
	}
	if f, ok := openai.Lookup(req.body, req.fields, "prompt"); ok {
		if count, first := openai.Elements(f.Value(req.body)); first == '"' || first == '[' {
			prompts = int64(count)
		}
	}
	return n, prompts
}
