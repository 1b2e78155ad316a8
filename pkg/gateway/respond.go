package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// maxResponseBody bounds a non-streamed backend answer held in memory.
const maxResponseBody = 64 << 20

// respond relays a non-streamed answer: the backend's body with usage.cost added and the public
// model id restored. It returns the error to answer with when there is no answer to relay, or
// when its settlement did not commit in time; nil when the client has its answer, or has left.
func (x *exchange) respond(ctx context.Context, resp *upstream.Response) error {
	in, out := answerBuffers.Get().(*bytes.Buffer), answerBuffers.Get().(*bytes.Buffer)
	defer putAnswerBuffers(in, out)
	_, err := in.ReadFrom(io.LimitReader(resp.Body, maxResponseBody+1))
	raw := in.Bytes()
	if err != nil {
		if x.requestCtxDone() {
			x.meter.billable = true // the backend worked for a client that left: bill the prompt, estimated
			x.event.Status = usage.StatusClientDisconnected
			x.event.HTTPStatus = 499
			return nil
		}
		if slotLost(ctx) {
			x.event.Status = usage.StatusSlotLost
			return errSlotLost // nothing was delivered: nothing is billed
		}
		resp.Failed()
		return x.badBackendBody(ctx, "the model backend failed while sending its answer.", err)
	}
	if len(raw) > maxResponseBody {
		return x.badBackendBody(ctx, "the model backend's answer was too large.", errors.New("response over limit"))
	}
	var buf [16]openai.Field // room for an answer's members without allocating
	var completion openai.ChatCompletion
	fields, err := openai.ParseCompletion(buf[:0], raw, &completion)
	if err != nil {
		resp.Failed()
		return x.badBackendBody(ctx, "the model backend sent an invalid answer.", err)
	}
	// A usable answer: from here on it is billed, even if the client leaves before reading it.
	x.meter.billable = true
	edits := make([]openai.Edit, 0, 2)
	// Choices of another shape than the reference's read as choices without a finish reason, and
	// still leave the usage to bill by.
	if completion.Usage != nil {
		if u, ok, err := openai.ParseUsage(completion.Usage); err == nil && ok {
			x.meter.usage, x.meter.haveUsage, x.meter.complete = u, true, true
			if cost, err := x.req.model.Pricing.Cost(u.PromptTokens, u.PromptTokensDetails.CachedTokens, u.CompletionTokens); err == nil {
				edits = append(edits, openai.Edit{Key: "usage", Value: openai.AppendWithCost(nil, completion.Usage, cost.Append(make([]byte, 0, 24)))})
			}
		}
	}
	if f, ok := openai.Lookup(raw, fields, "choices"); ok {
		x.meter.finish = firstFinishReason(&completion)
		if !x.meter.haveUsage {
			x.meter.chunks = int64(len(f.Value(raw))+3) / 4 // no usage at all: estimate from the text's size
		}
	}
	if resp.Backend.Model != x.req.model.ID {
		// The public model id goes back where the backend named its own.
		edits = append(edits, openai.Edit{Key: "model", Value: []byte(strconv.Quote(x.req.model.ID))})
	}
	out.Grow(len(raw) + 48)
	answer := openai.Rewrite(out.AvailableBuffer(), raw, fields, edits...)

	x.event.Status = usage.StatusCompleted
	x.event.HTTPStatus = http.StatusOK
	// At least 1 ms, as a stream's: 0 means no backend answered (Metrics.Request leaves it out).
	x.event.TTFTMillis = max(1, x.g.opt.Clock.Now().Sub(x.admitted.StartedAt).Milliseconds())
	if !x.conclude() {
		x.withhold()
		return errStoreDown
	}
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(answer)))
	x.w.WriteHeader(http.StatusOK)
	if _, err := x.w.Write(answer); err != nil {
		x.event.Status = usage.StatusClientDisconnected
		return nil
	}
	// Hand the answer to the client now rather than when the handler returns: the request's
	// log line and its event's publication, which come after this, are none of its waiting.
	_ = http.NewResponseController(x.w).Flush()
	return nil
}

// answerBuffers hold a non-streamed answer as the backend sent it and as the client gets it,
// for the time respond takes: nothing keeps either once the answer is written.
var answerBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putAnswerBuffers gives the buffers back, but leaves those of unusually large answers to the
// collector.
func putAnswerBuffers(bufs ...*bytes.Buffer) {
	for _, b := range bufs {
		if b.Cap() <= 64<<10 {
			b.Reset()
			answerBuffers.Put(b)
		}
	}
}

// badBackendBody is the plain-text 502 of a backend answer that cannot be relayed (for reason,
// logged with err), or the deadline's error when the request's deadline cut it.
func (x *exchange) badBackendBody(ctx context.Context, reason string, err error) error {
	if derr := x.deadlineError(ctx); derr != nil {
		return derr
	}
	x.g.log.LogAttrs(ctx, slog.LevelWarn, "bad backend answer", slog.String("generation_id", x.admitted.GenerationID), slog.String("backend", x.event.Backend), slog.String("error", err.Error()))
	x.event.Status = usage.StatusUpstreamError
	return errBadGateway(reason)
}

// firstFinishReason reads choices[0].finish_reason, "" when absent or null.
func firstFinishReason(answer *openai.ChatCompletion) string {
	if len(answer.Choices) == 0 {
		return ""
	}
	return answer.Choices[0].FinishReason
}
