package simulator

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// toolArguments are the arguments of every simulated tool call.
const toolArguments = `{"city": "Paris", "unit": "celsius"}`

// argumentPiece is the size in bytes of one streamed fragment of toolArguments.
const argumentPiece = 5

// answer is what the simulated model generates for each choice: count pieces, each one
// completion token, of which the first reasoning ones are reasoning.
type answer struct {
	count     int
	reasoning int
	finish    string // "" when the stream ends with an error event instead
	toolName  string // "" unless the answer is a tool call
	toolID    string // "call_..."
}

func newAnswer(req *request, seq int64) answer {
	d := req.directives
	if d.streamError != 0 && req.stream {
		// The error comes after the tokens the tokens directive asks for (none by default).
		return answer{count: max(0, d.tokens)}
	}
	if name := d.toolCall; name != "" {
		return answer{
			count:    (len(toolArguments) + argumentPiece - 1) / argumentPiece,
			finish:   "tool_calls",
			toolName: name,
			toolID:   fmt.Sprintf("call_%024x", seq),
		}
	}
	var a answer
	if req.maxTokens >= 0 {
		// The model talks until max_tokens, unless the tokens directive stops it sooner.
		a = answer{count: req.maxTokens, finish: "length"}
		if t := d.tokens; t >= 0 && t < req.maxTokens {
			a.count, a.finish = t, "stop"
		}
	} else {
		// With no max_tokens the model stops of its own accord, within what the context leaves
		// (vLLM lowers a missing max_tokens to fit).
		a = answer{count: naturalLength, finish: "stop"}
		if t := d.tokens; t >= 0 {
			a.count = t
		}
		if room := req.room(); room >= 0 && a.count > room {
			a.count, a.finish = room, "length"
		}
	}
	a.reasoning = min(d.reasoning, a.count)
	return a
}

// piece is the text of completion token i: reasoning "think0", " think1", ... then the content
// "tok0", " tok1", " tok2", ...; for a tool call, the i-th fragment of its arguments.
func (a answer) piece(i int) string {
	if a.toolName != "" {
		return toolArguments[i*argumentPiece : min((i+1)*argumentPiece, len(toolArguments))]
	}
	word, j := "tok", i-a.reasoning
	if i < a.reasoning {
		word, j = "think", i
	}
	if j == 0 {
		return word + "0"
	}
	return " " + word + strconv.Itoa(j)
}

// text is the whole generated content, and reasoningText its reasoning.
func (a answer) text() string { return a.join(a.reasoning, a.count) }

func (a answer) reasoningText() string { return a.join(0, a.reasoning) }

func (a answer) join(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(a.piece(i))
	}
	return b.String()
}

// generation is one answer being delivered: the same answer for each of its choices (n for each
// prompt; choice i answers prompt i / n).
type generation struct {
	req     *request
	answer  answer
	id      string
	created int64
	choices int
	sglang  bool
}

// serve answers a validated request, after the directives that replace or delay the answer.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, req *request, seq int64) {
	ctx := r.Context()
	d := req.directives
	sw := req.model.Server
	if sleep(ctx, d.firstByte) != nil {
		return
	}
	if d.status != 0 {
		writeStatus(w, sw, d.status)
		return
	}
	// What the server finds once generation has started: a stream then starts (200) and carries
	// only the error.
	engineErr := req.checkEngine()
	if err := req.checkContext(); err != nil {
		if !err.inEngine {
			writeRequestError(w, sw, err)
			return
		}
		engineErr = err
	}
	if d.streamError != 0 && !req.stream {
		writeRequestError(w, sw, simulated(d.streamError))
		return
	}
	if engineErr != nil && !req.stream {
		writeRequestError(w, sw, engineErr)
		return
	}
	if req.requiredToolChoice && req.model.RejectRequiredToolChoice {
		writePlain(w, http.StatusInternalServerError)
		return
	}

	prefix := "chatcmpl-"
	if req.endpoint == endpointCompletions {
		prefix = "cmpl-"
	}
	g := &generation{
		req:     req,
		answer:  newAnswer(req, seq),
		id:      fmt.Sprintf("%s%032x", prefix, seq),
		created: s.now().Unix(),
		choices: len(req.prompts) * req.n,
		sglang:  sw == SGLang,
	}
	if req.stream {
		fail := engineErr
		if fail != nil {
			g.answer = answer{} // refused before the first token
		} else if d.streamError != 0 {
			fail = simulated(d.streamError)
		}
		g.stream(ctx, w, fail)
		return
	}
	if d.dropAfter >= 0 {
		abort() // before any byte of the response
	}
	if sleep(ctx, d.delay*time.Duration(g.answer.count)) != nil {
		return
	}
	writeJSON(w, http.StatusOK, g.response())
}

// simulated is the error the status and stream_error directives answer with.
func simulated(status int) *requestError {
	return &requestError{status: status, message: "Simulated error: " + http.StatusText(status) + "."}
}

// writeStatus answers with a simulated failure: the server's error JSON for 4xx and for 501
// (vLLM's NotImplementedError), the plain status text its HTTP server sends for other 5xx.
func writeStatus(w http.ResponseWriter, sw Software, status int) {
	if status >= 500 && status != http.StatusNotImplemented {
		writePlain(w, status)
		return
	}
	writeRequestError(w, sw, simulated(status))
}

// sleep waits for d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// usage is the request's whole usage, as a non-streamed answer and the final usage chunk carry
// it: every prompt once, every choice's completion. Cached tokens are reported only with the
// server's cache-report flag: by vLLM always (zero included), by SGLang only when there are some.
func (g *generation) usage() *usage {
	prompt := 0
	for _, p := range g.req.prompts {
		prompt += p
	}
	completion := g.answer.count * g.choices
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if g.req.model.CachedTokens {
		cached := min(max(0, g.req.directives.cached), prompt)
		if !g.sglang || cached > 0 {
			u.PromptTokensDetails = &promptTokensDetails{CachedTokens: cached}
		}
	}
	return u
}

// running is the usage a chunk of choice i carries with continuous usage stats, after its
// completion tokens so far: both servers count one choice at a time (the prompt of its own
// prompt) and never report cached tokens there; SGLang only on chat (serving_completions.py at
// 7190e6fe8cfd puts no usage on its chunks).
func (g *generation) running(i, completion int) *usage {
	if !g.req.continuousUsage || (g.sglang && g.req.endpoint == endpointCompletions) {
		return nil // SGLang's completions stream ignores continuous_usage_stats
	}
	p := g.req.prompts[i/g.req.n]
	return &usage{PromptTokens: p, CompletionTokens: completion, TotalTokens: p + completion}
}

// response is the non-streaming body.
func (g *generation) response() any {
	a := g.answer
	u := g.usage()
	if g.req.endpoint == endpointCompletions {
		choices := make([]textChoice, g.choices)
		for i := range choices {
			choices[i] = textChoice{Index: i, Text: a.text(), FinishReason: &a.finish}
		}
		return envelope(g, "text_completion", choices, u)
	}
	choices := make([]chatChoice, g.choices)
	for i := range choices {
		msg := &chatMessage{Role: "assistant"}
		if a.toolName != "" {
			msg.ToolCalls = []toolCall{{
				ID:       a.toolID,
				Type:     "function",
				Function: toolFunction{Name: a.toolName, Arguments: toolArguments},
			}}
		} else {
			text := a.text()
			msg.Content = &text
		}
		if a.reasoning > 0 {
			r := a.reasoningText()
			if g.sglang {
				msg.ReasoningContent = &r
			} else {
				msg.Reasoning = &r
			}
		}
		choices[i] = chatChoice{Index: i, Message: msg, FinishReason: &a.finish}
	}
	return envelope(g, "chat.completion", choices, u)
}

// separateFinish reports whether the finish reason comes in a chunk of its own, after the last
// token of every choice: SGLang's chat stream does so (serving_chat.py), its completions stream
// and vLLM put the last token and the finish reason in one chunk.
func (g *generation) separateFinish() bool {
	return g.sglang && g.req.endpoint == endpointChat
}

// stream writes the answer as server-sent events, flushing each at once, and stops as soon as
// the client goes away. Each token step sends one chunk per choice; separateFinish says where the
// finish reason goes. A stream that fails (fail not nil) ends with the server's error
// event and [DONE]: at once when the failure came before any output (no role chunk, as when
// vLLM's engine refuses a request), after the answer's tokens otherwise.
func (g *generation) stream(ctx context.Context, w http.ResponseWriter, fail *requestError) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	events := &eventWriter{w: w, rc: http.NewResponseController(w)}
	a, d := g.answer, g.req.directives
	if fail == nil || a.count > 0 { // a failure before any output has no role chunk either
		g.sendOpening(events)
		sent := 0
		for k := range a.count {
			if events.err != nil || sleep(ctx, d.delay) != nil {
				return
			}
			for i := range g.choices {
				if sent == d.dropAfter {
					abort()
				}
				events.send(g.pieceChunk(i, k, k == a.count-1 && fail == nil && !g.separateFinish()))
				sent++
			}
		}
		if events.err != nil {
			return
		}
		if d.dropAfter >= 0 {
			abort()
		}
	}
	if fail != nil {
		events.write(g.req.model.Server.streamErrorEvent(fail))
	} else {
		if a.count == 0 || g.separateFinish() {
			for i := range g.choices {
				events.send(g.finishChunk(i))
			}
		}
		if g.req.includeUsage {
			events.send(g.usageChunk())
		}
	}
	events.write([]byte("[DONE]"))
}

// abort cuts the connection after what was flushed: no final chunk, no [DONE], no terminating
// zero-length chunk. net/http closes the connection on this panic and does not log it.
func abort() {
	panic(http.ErrAbortHandler)
}

// sendOpening sends what a chat stream sends before the first token of each choice: the assistant
// role (with vLLM's continuous usage, the prompt alone) and, for a tool call, the call's id, type
// and name with empty arguments.
func (g *generation) sendOpening(events *eventWriter) {
	if g.req.endpoint == endpointCompletions {
		return
	}
	empty := ""
	for i := range g.choices {
		var u *usage
		if !g.sglang {
			u = g.running(i, 0)
		}
		events.send(g.chatChunk(i, &chatDelta{Role: "assistant", Content: &empty}, nil, u))
		if a := g.answer; a.toolName != "" {
			index := 0
			events.send(g.chatChunk(i, &chatDelta{ToolCalls: []toolCall{{
				Index:    &index,
				ID:       a.toolID,
				Type:     "function",
				Function: toolFunction{Name: a.toolName},
			}}}, nil, u))
		}
	}
}

// pieceChunk is token k of choice i; with last, it carries the finish reason too (vLLM).
func (g *generation) pieceChunk(i, k int, last bool) any {
	a := g.answer
	text := a.piece(k)
	u := g.running(i, k+1)
	var finish *string
	if last {
		finish = &a.finish
	}
	if g.req.endpoint == endpointCompletions {
		return g.textChunk(i, text, finish, u)
	}
	var delta *chatDelta
	switch {
	case a.toolName != "":
		index := 0
		delta = &chatDelta{ToolCalls: []toolCall{{Index: &index, Function: toolFunction{Arguments: text}}}}
	case k < a.reasoning && g.sglang:
		delta = &chatDelta{ReasoningContent: &text}
	case k < a.reasoning:
		delta = &chatDelta{Reasoning: &text}
	default:
		delta = &chatDelta{Content: &text}
	}
	return g.chatChunk(i, delta, finish, u)
}

// finishChunk carries choice i's finish reason alone: SGLang's way, and vLLM's for an answer of
// no tokens (its last output is then empty text).
func (g *generation) finishChunk(i int) any {
	finish := g.answer.finish
	if g.req.endpoint == endpointCompletions {
		return g.textChunk(i, "", &finish, nil)
	}
	delta := &chatDelta{}
	if !g.sglang {
		empty := ""
		delta.Content = &empty
	}
	return g.chatChunk(i, delta, &finish, nil)
}

// usageChunk is the final usage chunk. SGLang writes its completions one without nulls
// (exclude_none), as vLLM does.
func (g *generation) usageChunk() any {
	u := g.usage()
	switch {
	case g.req.endpoint == endpointCompletions:
		return envelope(g, "text_completion", []textChoice{}, u)
	case g.sglang:
		return sglangEnvelope(g, "chat.completion.chunk", []sglangChatChoice{}, (*sglangUsage)(u))
	}
	return envelope(g, "chat.completion.chunk", []chatChoice{}, u)
}

func (g *generation) chatChunk(i int, d *chatDelta, finish *string, u *usage) any {
	if g.sglang {
		delta := sglangDelta{Content: d.Content, ReasoningContent: d.ReasoningContent, ToolCalls: d.ToolCalls}
		if d.Role != "" {
			delta.Role = &d.Role
		}
		// The same usage, as SGLang writes it: a conversion, the two types differ only in their tags.
		return sglangEnvelope(g, "chat.completion.chunk", []sglangChatChoice{{Index: i, Delta: delta, FinishReason: finish}}, (*sglangUsage)(u))
	}
	return envelope(g, "chat.completion.chunk", []chatChoice{{Index: i, Delta: d, FinishReason: finish}}, u)
}

func (g *generation) textChunk(i int, text string, finish *string, u *usage) any {
	c := textChoice{Index: i, Text: text, FinishReason: finish}
	if g.sglang {
		return sglangEnvelope(g, "text_completion", []sglangTextChoice{{textChoice: c}}, u)
	}
	return envelope(g, "text_completion", []textChoice{c}, u)
}

// envelope is a response or chunk of g with choices and usage u.
func envelope[C any](g *generation, object string, choices []C, u *usage) *completion[C] {
	return &completion[C]{ID: g.id, Object: object, Created: g.created, Model: g.req.model.Name, Choices: choices, Usage: u}
}

// sglangEnvelope is an SGLang chunk of g, with its explicit nulls: pydantic's model_dump_json
// writes every field, "usage": null included.
func sglangEnvelope[C, U any](g *generation, object string, choices []C, u *U) *sglangChunk[C, U] {
	return &sglangChunk[C, U]{ID: g.id, Object: object, Created: g.created, Model: g.req.model.Name, Choices: choices, Usage: u}
}

// eventWriter writes server-sent events and flushes each one. After a write fails it writes
// nothing more and keeps the error, so that a stream checks for a gone client once per token.
type eventWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func (e *eventWriter) send(v any) {
	if e.err == nil {
		e.write(marshal(v))
	}
}

func (e *eventWriter) write(data []byte) {
	if e.err != nil {
		return
	}
	if _, e.err = fmt.Fprintf(e.w, "data: %s\n\n", data); e.err == nil {
		e.err = e.rc.Flush()
	}
}
