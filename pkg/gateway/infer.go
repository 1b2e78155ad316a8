package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// newGenerationID returns "gen-" and a ULID of now: unique, sortable by time, made before the
// backend is called so that every response can carry it.
func newGenerationID(now time.Time) string {
	return "gen-" + ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
}

// infer serves the two inference endpoints, in the contract's order of checks. It returns the
// error of a request refused before admission; an admitted request's exchange answers it.
func (g *Gateway) infer(w http.ResponseWriter, r *http.Request, ep *endpoint) error {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return errMethod(r, http.MethodPost)
	}
	x, err := g.admit(w, r, ep)
	if x == nil {
		return err
	}
	// From here on the request owns a slot: whatever happens, it is settled — the slot and its
	// reservation released, what was generated debited, the event recorded — before the client
	// sees the end of its answer, or, when the answer ends without the gateway writing it (a
	// client that left), by end.
	defer x.end()
	if err == nil {
		err = x.forward(x.fenced)
	}
	if err != nil {
		x.fail(err)
	}
	x.abortIfGone()
	return nil
}

// exchange is one admitted inference request on its way through the gateway. Its state is kept
// by concern: its usage event as admitted (shared with GET /v1/generation, never written after
// admission) and what each step decides of it; the slot it holds until settlement (lease.go);
// what the backend consumed (meter); once settled, what that came to (outcome, settle.go).
type exchange struct {
	g      *Gateway
	w      http.ResponseWriter
	reqCtx context.Context // the client's request: cancelled when it leaves
	fenced context.Context // reqCtx, also cancelled with causeSlotLost when the lease lapses
	ep     *endpoint
	req    *request // nil when the request failed its checks

	admitted *usage.Event
	event    decisions
	slot     slot
	meter    meter
	outcome  *outcome // nil until conclude
}

// decisions are what the steps of an exchange decide of its usage event; settlement adds them,
// and what the meter measured, to the event as admitted. A stream's TTFT is metered.
type decisions struct {
	Status     usage.Status
	HTTPStatus int
	Backend    string
	TTFTMillis int64
}

// fail answers with err before anything was streamed; the request is settled first.
func (x *exchange) fail(err error) {
	x.event.HTTPStatus = answer(err).status
	x.conclude()
	writeError(x.w, err)
}

// forward sends the request to a backend (step 8) and relays the answer. It returns the error
// to answer with when the backend gave no answer to relay, or when a whole answer could not be
// settled in time; nil when the client has its answer, or has left.
func (x *exchange) forward(ctx context.Context) error {
	x.event.Status = usage.StatusUpstreamError
	if dl, ok := ctx.Deadline(); ok {
		// On Lambda the request has a deadline: the call stops early enough to settle before it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-x.g.opt.SettleReserve))
		defer cancel()
	}
	resp, err := x.g.opt.Upstream.Do(ctx, upstream.Call{Model: x.req.model, Path: x.ep.path, Body: x.req.forward, OrgID: x.admitted.OrgID})
	x.meter.promptEstimate = func() int64 { return estimatePromptTokens(x.ep.chat, x.req.body) }
	if x.req.stream {
		x.meter.n, x.meter.prompts = x.req.choices()
	}
	if err != nil {
		return x.unanswered(ctx, err)
	}
	defer resp.Body.Close()
	if err := x.answered(ctx, resp); err != nil {
		return err
	}
	if x.req.stream {
		return x.relay(ctx, resp)
	}
	return x.respond(ctx, resp)
}

// unanswered is the error of a backend call that got no response headers; nil for a client
// that left.
func (x *exchange) unanswered(ctx context.Context, err error) error {
	var ue *upstream.Error
	if errors.As(err, &ue) {
		x.event.Backend = ue.Backend // the backend called, also when the client left meanwhile
	}
	if x.requestCtxDone() {
		x.event.Status = usage.StatusClientDisconnected
		x.event.HTTPStatus = statusClientGone // nobody is left to read a status
		x.meter.billable = true               // the backend may have started: bill the prompt, estimated
		return nil
	}
	if slotLost(ctx) {
		x.event.Status = usage.StatusSlotLost
		return errSlotLost // nothing was delivered: nothing is billed
	}
	if errors.Is(err, upstream.ErrUnavailable) {
		return errUnavailable(x.req.model.ID)
	}
	if derr := x.deadlineError(ctx); derr != nil {
		return derr
	}
	x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend request failed", slog.String("generation_id", x.admitted.GenerationID), slog.String("backend", x.event.Backend), slog.String("error", err.Error()))
	return errBackendUnreachable
}

// deadlineError is the error of a backend call that the request's own deadline (ctx is the
// backend context: the deadline less the settle reserve, see forward) ended before
// anything reached the client: 503 deadline_exceeded, and the usage event says so; nil when the
// deadline did not end it. A deadline that had passed before the request started (shorter than
// the reserve) means the backend was never called, and the message says that. A client that
// left is not a deadline.
func (x *exchange) deadlineError(ctx context.Context) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || x.requestCtxDone() {
		return nil
	}
	dl, _ := ctx.Deadline()
	x.event.Status = usage.StatusDeadlineExceeded
	return errDeadline(!dl.After(x.admitted.StartedAt))
}

// answered records which backend answered, and returns the error to answer with when its status
// does not let the answer through.
func (x *exchange) answered(ctx context.Context, resp *upstream.Response) error {
	x.event.Backend = resp.Backend.Name
	x.meter.exactPerChunk = resp.Backend.ContinuousUsage
	x.meter.cachedTokens = resp.Backend.CachedTokens
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return nil
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
			x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend engine failed", slog.String("generation_id", x.admitted.GenerationID), slog.String("backend", x.event.Backend), slog.Int("backend_status", s), slog.String("backend_message", logged))
			return errBackendFailed
		}
		return x.refused(ctx, resp, be)
	case s == http.StatusTooManyRequests:
		return errUnavailable(x.req.model.ID)
	default:
		x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend answered with an error", slog.String("generation_id", x.admitted.GenerationID), slog.String("backend", x.event.Backend), slog.Int("backend_status", s))
		return errBackendStatus
	}
}

// maxErrorBody bounds what is read of a backend's error body. vLLM repeats the request in some
// messages, so a body can be as large as the request; its message is read as far as it goes.
const maxErrorBody = 64 << 10

// refused records that the backend refused the request as the request's own fault, logs the
// backend's message in full, without the request's content, and returns the client's error. The
// request is "rejected", as one the gateway refuses itself: the backend did what it should, and
// nothing was generated (what was, on a stream, is billed as usual).
func (x *exchange) refused(ctx context.Context, resp *upstream.Response, be backendError) *apiError {
	x.event.Status = usage.StatusRejected
	msg, logged := x.backendMessage(resp, be.message)
	x.g.log.LogAttrs(ctx, slog.LevelInfo, "backend refused the request",
		slog.String("generation_id", x.admitted.GenerationID), slog.String("backend", x.event.Backend),
		slog.Int("backend_status", be.status), slog.String("param", be.param), slog.String("backend_message", logged))
	return errRefused(msg, be.param)
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

// choices reads how many choices a request asks for, for metering a stream by choice: n (1 when
// absent or not a count), and the number of prompts of a completions prompt array of strings or
// of token-id lists (1 otherwise; one list of token ids is one prompt).
func (req *request) choices() (n, prompts int64) {
	return max(1, positiveInt(req, "n")), promptCount(req)
}
