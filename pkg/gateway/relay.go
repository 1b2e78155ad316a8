package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// stream writes events to the client and keeps the connection alive while the backend is
// silent, on the gateway's clock. Writes from the relay loop and from the keepalive timer are
// serialised by mu.
type stream struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	every     time.Duration
	mu        sync.Mutex
	closed    bool
	failed    bool // a write to the client failed: it is gone
	keepalive Timer
}

func newStream(w http.ResponseWriter, clock Clock, every time.Duration) *stream {
	s := &stream{w: w, rc: http.NewResponseController(w), every: every}
	s.mu.Lock() // a ping that a test's clock runs at once waits until the timer is kept
	defer s.mu.Unlock()
	s.keepalive = clock.AfterFunc(every, s.ping)
	return s
}

func (s *stream) ping() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.failed {
		return
	}
	s.writeLocked(openai.Keepalive)
	s.flushLocked()
}

// write queues b for the client; flush sends what is queued. false when the client is gone.
func (s *stream) write(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeLocked(b)
	return !s.failed
}

func (s *stream) flush() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	return !s.failed
}

func (s *stream) writeLocked(b []byte) {
	if s.failed {
		return
	}
	if _, err := s.w.Write(b); err != nil {
		s.failed = true
	}
}

// flushLocked sends what was written and restarts the keepalive clock: silence is measured from
// the last bytes the client received.
func (s *stream) flushLocked() {
	if s.failed {
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.failed = true
		return
	}
	s.keepalive.Reset(s.every)
}

// close stops the keepalives; after it returns, nothing more is written by the timer.
func (s *stream) close() {
	s.keepalive.Stop()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// relay streams a backend's server-sent events to the client, event by event: per-chunk usage
// removed, the usage chunk given its cost (or dropped when the client did not ask for it), the
// public model id restored. A stream that breaks after the first byte ends with an error event
// and no [DONE]; what was generated is billed. It returns the error to answer with when the
// backend did not stream.
func (x *exchange) relay(ctx context.Context, resp *upstream.Response) error {
	s, err := x.openStream(ctx, resp)
	if err != nil {
		return err
	}
	defer s.close()
	r := newRelayState(x, resp)
	defer r.release()
	r.pump(s)
	x.closeStream(ctx, resp, s, r)
	return nil
}

// openStream checks that the backend streams, sends the client the status and headers, and
// returns the stream to write events to; the 502 to answer with when the backend did not stream.
func (x *exchange) openStream(ctx context.Context, resp *upstream.Response) (*stream, error) {
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "text/event-stream" {
		resp.Failed()
		return nil, x.badBackendBody(ctx, "the model backend did not stream its answer.", errors.New("content type "+ct))
	}
	x.meter.billable = true // the stream starts: what is generated from here on is billed
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	x.w.WriteHeader(http.StatusOK)
	x.event.HTTPStatus = http.StatusOK
	s := newStream(x.w, x.g.opt.Clock, x.g.opt.Keepalive)
	s.flush() // the client learns the status now, before the first token
	return s, nil
}

// pump relays events until the stream ends: with r.done set when the backend sent [DONE],
// otherwise with r.err the error that ended it (nil when the client left).
func (r *relayState) pump(s *stream) {
	unflushed := false
	for {
		// Flush before any read that could wait: events already read are never held back by
		// events not yet arrived, while a burst that arrived together goes out in one write.
		// The chunk buffers go back to chunkPool there too, so that a stream waiting for its
		// backend holds none of them; a burst keeps them from its first event to its last.
		if !r.dec.Pending() {
			if unflushed && !s.flush() {
				return
			}
			unflushed = false
			r.release()
		}
		ev, err := r.dec.Next()
		if err != nil {
			r.err = err
			return
		}
		wrote, more := r.relayEvent(s, ev.Data)
		if !more {
			return
		}
		unflushed = unflushed || wrote
	}
}

// relayEvent relays one event's data, reporting whether it wrote to the client and whether the
// stream goes on.
func (r *relayState) relayEvent(s *stream, data []byte) (wrote, more bool) {
	if len(data) == 0 { // a comment, or an event without data
		return false, true
	}
	if openai.IsDone(data) {
		r.done = true
		return false, false
	}
	out, err := r.chunk(data)
	if err != nil {
		r.err = err
		return false, false
	}
	if out == nil {
		return false, true
	}
	if !s.write(out) {
		return false, false
	}
	if r.content {
		r.x.meter.delivered(r.x.g.opt.Clock)
	}
	return true, true
}

// closeStream ends the client's stream as the relay r left it: [DONE] after a complete answer,
// the backend's refusal after one it refused inside its stream, an error event after a broken
// one, nothing for a client that left. The stream's last event comes after the request's
// settlement (see finish).
func (x *exchange) closeStream(ctx context.Context, resp *upstream.Response, s *stream, r *relayState) {
	switch {
	case s.failed || x.requestCtxDone():
		x.event.Status = usage.StatusClientDisconnected
	case r.done:
		if x.meter.haveUsage {
			x.meter.complete = true
		}
		var usageChunk []byte
		if x.req.includeUsage && !r.usageSent && x.meter.haveUsage {
			// The backend put usage only on a content chunk; give the client its usage chunk.
			usageChunk = openai.AppendData(nil, r.synthesizeUsage())
		}
		x.event.Status = usage.StatusCompleted
		x.finish(s, usageChunk, doneEvent)
	case r.refusal != nil && rejects(r.refusal.status) && !engineFailure(r.refusal.message):
		// The backend validated the request only once its stream had started (vLLM's engine
		// does; SGLang checks the context there): the client gets the error a non-streamed
		// request would have, as the stream's last event. The backend is healthy, and only
		// what it generated before refusing is billed.
		be := *r.refusal
		x.meter.billable = x.meter.produced()
		x.event.HTTPStatus = http.StatusBadRequest
		x.finish(s, errorEventData(x.refused(ctx, resp, be)))
	default:
		err := errStreamBroke
		x.event.Status = usage.StatusUpstreamError
		switch {
		case slotLost(ctx):
			err = errStreamSlotLost
			x.event.Status = usage.StatusSlotLost
		case ctx.Err() != nil:
			err = errStreamDeadline
			x.event.Status = usage.StatusDeadlineExceeded
		default:
			attrs := []slog.Attr{slog.String("generation_id", x.admitted.GenerationID), slog.String("backend", x.event.Backend)}
			if be := r.refusal; be != nil {
				// An error event that is not about the request: it counts as its status would.
				resp.StreamStatus(max(be.status, http.StatusInternalServerError))
				_, logged := x.backendMessage(resp, be.message)
				attrs = append(attrs, slog.Int("backend_status", be.status), slog.String("backend_message", logged))
			} else {
				resp.Failed()
			}
			if r.err != nil && r.err != io.EOF && r.err != errBackendEvent {
				attrs = append(attrs, slog.String("error", r.err.Error()))
			}
			x.g.log.LogAttrs(ctx, slog.LevelWarn, "backend stream broke", attrs...)
		}
		x.finish(s, errorEventData(err))
	}
}

// finish ends a stream the gateway ends itself, and every such stream ends here: what precedes
// the last event goes out at once, the request is settled — its slot and reservation released,
// its debit and event recorded — and then comes the last event, [DONE] after a complete answer
// or the final error event, so that a client that sees the end never finds its request still in
// flight, nor an answer whose debit could yet be lost. A complete answer whose settlement did not
// commit in time ends with a store_unavailable event instead of [DONE]; what it delivered is
// billed once the store takes it.
func (x *exchange) finish(s *stream, final ...[]byte) {
	last := final[len(final)-1]
	for _, b := range final[:len(final)-1] {
		if b != nil {
			s.write(b)
		}
	}
	s.flush()
	if !x.conclude() && bytes.Equal(last, doneEvent) {
		last = errorEventData(errStreamUnrecorded)
	}
	s.write(last)
	s.flush()
}

// relayState is a relay's decoder, what its loop remembers between chunks, and how it ended.
type relayState struct {
	x         *exchange
	dec       *openai.Decoder
	rename    bool
	modelJSON []byte
	buf       *chunkBuffers // from chunkPool while a burst of events is relayed; nil while waiting
	content   bool          // the last chunk carried generated content
	usageSent bool
	done      bool          // the backend ended the stream with [DONE]
	refusal   *backendError // the error event the backend ended the stream with
	err       error         // what else ended it: a read error, or a chunk that could not be relayed
	// head is a usage chunk's start as the first chunk has it (its id, object and created),
	// for the usage chunk the gateway sends when the backend sent none.
	head []byte
}

// newRelayState returns the state of a relay of resp.
func newRelayState(x *exchange, resp *upstream.Response) *relayState {
	r := &relayState{x: x, dec: openai.NewDecoder(resp.Body), rename: resp.Backend.Model != x.req.model.ID}
	if r.rename {
		r.modelJSON = strconv.AppendQuote(nil, x.req.model.ID)
	}
	return r
}

// chunkBuffers are what rewriting a chunk needs: its parsed fields and the bytes to send. A relay
// takes them from chunkPool for the first chunk of a burst and gives them back before it waits for
// the backend again (see pump), so that streams reuse them rather than grow their own, and an open
// stream that waits holds none.
type chunkBuffers struct {
	fields []openai.Field
	chunk  openai.ChatCompletionChunk // its choices, read with the fields
	edits  [2]openai.Edit
	out    []byte
}

var chunkPool = sync.Pool{New: func() any { return new(chunkBuffers) }}

// release gives the chunk buffers back; those of an unusually large event are left to the
// collector.
func (r *relayState) release() {
	if b := r.buf; b != nil {
		r.buf = nil
		if cap(b.out) <= 64<<10 && cap(b.fields) <= 1024 {
			chunkPool.Put(b)
		}
	}
}

// doneEvent ends a complete stream.
var doneEvent = []byte("data: [DONE]\n\n")

var errBackendEvent = errors.New("backend sent an error event")

// chunk transforms one backend chunk into the bytes to send (nil: send nothing).
func (r *relayState) chunk(data []byte) ([]byte, error) {
	x := r.x
	var err error
	if r.buf == nil {
		r.buf = chunkPool.Get().(*chunkBuffers)
	}
	b := r.buf
	b.fields, err = openai.ParseChunk(b.fields[:0], data, &b.chunk)
	if err != nil {
		return nil, err
	}
	fields := b.fields
	if b.chunk.Error != nil {
		r.refusal = errorEvent(data)
		return nil, errBackendEvent
	}
	if r.head == nil {
		r.head = usageChunkHead(data, fields)
	}
	usage := b.chunk.Usage
	hasUsage := usage != nil
	nullUsage := hasUsage && usage.Kind() == 'n' // SGLang writes "usage": null
	hasUsage = hasUsage && !nullUsage
	final := len(b.chunk.Choices) == 0 && emptyChoices(data, fields)
	r.content = false
	edits := b.edits[:0]
	index := 0
	if !final {
		// With continuous usage, a content chunk's usage is its own choice's, so its index is
		// read, when there is more than one choice.
		index = r.inspectChoice(&b.chunk, hasUsage && x.meter.exactPerChunk && (x.meter.n > 1 || x.meter.prompts > 1))
	}
	if hasUsage {
		if final || !x.meter.exactPerChunk {
			x.meter.observe(usage)
			x.meter.complete = x.meter.complete || final
		} else {
			x.meter.observeChoice(index, usage)
		}
		if len(x.req.body) > keepBodyUpTo {
			x.dropBody(usage)
		}
	}

	if final {
		// The usage chunk.
		if !hasUsage || !x.req.includeUsage {
			return nil, nil
		}
		u, err := x.meter.current()
		if err != nil {
			return nil, err
		}
		cost, err := x.req.model.Pricing.Cost(u.PromptTokens, u.PromptTokensDetails.CachedTokens, u.CompletionTokens)
		if err != nil {
			return nil, err
		}
		edits = append(edits, openai.Edit{Key: "usage", Value: openai.AppendWithCost(nil, usage, cost.Append(make([]byte, 0, 24)))})
		r.usageSent = true
	} else {
		if hasUsage || nullUsage {
			edits = append(edits, openai.Edit{Key: "usage"}) // per-chunk usage is the gateway's, not the client's
		}
	}
	if r.rename {
		edits = append(edits, openai.Edit{Key: "model", Value: r.modelJSON})
	}
	if len(edits) == 0 {
		b.out = openai.AppendData(b.out[:0], data)
		return b.out, nil
	}
	b.out = append(b.out[:0], "data: "...)
	b.out = openai.Rewrite(b.out, data, fields, edits...)
	b.out = append(b.out, "\n\n"...)
	return b.out, nil
}

// emptyChoices reports whether a chunk from which no choice was read has a choices array: an
// empty one, as a usage chunk has. It is apart from chunk because content chunks, which have a
// choice, need not look.
func emptyChoices(data []byte, fields []openai.Field) bool {
	f, _ := openai.Lookup(data, fields, "choices")
	return f.Value(data).Kind() == '['
}

// usageChunkHead is the start of a usage chunk for the stream whose first chunk is data: its id
// ("" when it has none), object and created, as the backend wrote them.
func usageChunkHead(data []byte, fields []openai.Field) []byte {
	var buf [256]byte
	b := append(buf[:0], `{"id":`...)
	if f, ok := openai.Lookup(data, fields, "id"); ok {
		b = append(b, f.Value(data)...)
	} else {
		b = append(b, `""`...)
	}
	for _, k := range [...]string{"object", "created"} {
		if f, ok := openai.Lookup(data, fields, k); ok {
			b = append(append(append(b, `,"`...), k...), `":`...)
			b = append(b, f.Value(data)...)
		}
	}
	return bytes.Clone(b) // kept for the rest of the stream: no larger than it is
}

// errorEvent reads the error event a backend ended its stream with. It is kept out of chunk,
// whose frame every chunk pays for.
//
//go:noinline
func errorEvent(data []byte) *backendError {
	be, _ := parseBackendError(data)
	return &be
}

// keepBodyUpTo is the size up to which a stream keeps the client's request body to its end.
const keepBodyUpTo = 8 << 10

// dropBody lets go of a large request body once the backend has reported the prompt's tokens in
// usage: the body was kept only to estimate them should the stream end without usage. The
// reported count stands in for the estimate, should a later report be unusable.
func (x *exchange) dropBody(usageValue []byte) {
	u, ok, err := openai.ParseUsage(usageValue)
	if err != nil || !ok || u.PromptTokens <= 0 {
		return
	}
	// A report counts one prompt; a prompt array's others are taken to be as long.
	prompt := u.PromptTokens * max(x.meter.prompts, 1)
	x.meter.promptEstimate = func() int64 { return prompt }
	x.req.body = nil
}

// inspectChoice reads the first choice's finish reason and whether it carries generated content
// (delta content, reasoning or tool-call fragments, or a completion's text), and, when asked,
// the choice's index.
func (r *relayState) inspectChoice(chunk *openai.ChatCompletionChunk, wantIndex bool) (index int) {
	if len(chunk.Choices) == 0 {
		return index
	}
	first := &chunk.Choices[0]
	if wantIndex {
		index = first.Index
	}
	if first.FinishReason != "" {
		r.x.meter.finish = first.FinishReason
	}
	r.content = first.Text != "" || first.Delta.Generated()
	return index
}

// synthesizeUsage builds a usage chunk from the last usage the backend reported.
func (r *relayState) synthesizeUsage() []byte {
	x := r.x
	u, _ := x.meter.current()
	cost, _ := x.req.model.Pricing.Cost(u.PromptTokens, u.PromptTokensDetails.CachedTokens, u.CompletionTokens)
	b := append([]byte(nil), r.head...) // a chunk with usage came: head is set
	b = append(b, `,"model":`...)
	b = strconv.AppendQuote(b, x.req.model.ID)
	b = append(b, `,"choices":[],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, u.PromptTokens, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, u.CompletionTokens, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, u.PromptTokens+u.CompletionTokens, 10)
	if u.PromptTokensDetails.CachedTokens > 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, u.PromptTokensDetails.CachedTokens, 10)
		b = append(b, '}')
	}
	b = append(b, `,"cost":`...)
	b = cost.Append(b)
	return append(b, "}}"...)
}
