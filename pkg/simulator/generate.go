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

// answer is what the simulated model generates: count pieces, each one completion token.
type answer struct {
	count     int
	finish    string
	toolName  string   // "" unless the answer is a tool call
	toolID    string   // "call_..."
	fragments []string // the tool call's arguments, in pieces
}

func newAnswer(req *request, seq int64) answer {
	if name := req.directives.toolCall; name != "" {
		var fragments []string
		for rest := toolArguments; rest != ""; {
			n := min(argumentPiece, len(rest))
			fragments = append(fragments, rest[:n])
			rest = rest[n:]
		}
		return answer{
			count:     len(fragments),
			finish:    "tool_calls",
			toolName:  name,
			toolID:    fmt.Sprintf("call_%024x", seq),
			fragments: fragments,
		}
	}
	a := answer{count: req.maxTokens, finish: "length"}
	if t := req.directives.tokens; t >= 0 && t < req.maxTokens {
		a.count, a.finish = t, "stop"
	}
	return a
}

// piece is the text of completion token i: "tok0", " tok1", " tok2", ...; for a tool call, the
// i-th fragment of its arguments.
func (a answer) piece(i int) string {
	if a.toolName != "" {
		return a.fragments[i]
	}
	if i == 0 {
		return "tok0"
	}
	return " tok" + strconv.Itoa(i)
}

// text is the whole generated text.
func (a answer) text() string {
	var b strings.Builder
	for i := range a.count {
		b.WriteString(a.piece(i))
	}
	return b.String()
}

// generation is one answer being delivered.
type generation struct {
	req     *request
	answer  answer
	id      string
	created int64
}

// serve answers a validated request, after the directives that replace or delay the answer.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, req *request, seq int64) {
	ctx := r.Context()
	d := req.directives
	if sleep(ctx, d.firstByte) != nil {
		return
	}
	if d.status != 0 {
		writeStatus(w, d.status)
		return
	}
	if err := req.checkContext(); err != nil {
		writeRequestError(w, err)
		return
	}
	if req.requiredToolChoice && req.model.RejectRequiredToolChoice {
		writePlain(w, http.StatusInternalServerError, http.StatusText(http.StatusInternalServerError))
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
	}
	if req.stream {
		g.stream(ctx, w)
		return
	}
	if d.dropAfter >= 0 {
		// Closes the connection without a response: net/http's documented way to abort.
		panic(http.ErrAbortHandler)
	}
	if sleep(ctx, d.delay*time.Duration(g.answer.count)) != nil {
		return
	}
	writeJSON(w, http.StatusOK, g.response())
}

// writeStatus answers with a simulated failure: vLLM's JSON for 4xx, the plain status text its
// server sends for 5xx.
func writeStatus(w http.ResponseWriter, status int) {
	if status >= 500 {
		writePlain(w, status, http.StatusText(status))
		return
	}
	writeError(w, status, "Simulated error: "+http.StatusText(status)+".")
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

func (g *generation) usage(completion int) *usage {
	u := &usage{
		PromptTokens:     g.req.promptTokens,
		CompletionTokens: completion,
		TotalTokens:      g.req.promptTokens + completion,
	}
	if c := g.req.directives.cached; c >= 0 {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: min(c, g.req.promptTokens)}
	}
	return u
}

// response is the non-streaming body.
func (g *generation) response() any {
	a := g.answer
	u := g.usage(a.count)
	if g.req.endpoint == endpointCompletions {
		return &textCompletion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.req.model.Name,
			Choices: []textChoice{{Text: a.text(), FinishReason: &a.finish}},
			Usage:   u,
		}
	}
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
	return &chatCompletion{
		ID: g.id, Object: "chat.completion", Created: g.created, Model: g.req.model.Name,
		Choices: []chatChoice{{Message: msg, FinishReason: &a.finish}},
		Usage:   u,
	}
}

// stream writes the answer as server-sent events, one per token, flushing each at once, and
// stops as soon as the client goes away.
func (g *generation) stream(ctx context.Context, w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	events := &eventWriter{w: w, rc: http.NewResponseController(w)}

	a, d := g.answer, g.req.directives
	running := func(completion int) *usage {
		if g.req.continuousUsage {
			return g.usage(completion)
		}
		return nil
	}

	for _, c := range g.opening(running(0)) {
		if events.send(c) != nil {
			return
		}
	}
	for i := range a.count {
		if i == d.dropAfter {
			abort()
		}
		if sleep(ctx, d.delay) != nil {
			return
		}
		if events.send(g.pieceChunk(i, running(i+1))) != nil {
			return
		}
	}
	if d.dropAfter >= 0 {
		abort()
	}
	if events.send(g.finishChunk(running(a.count))) != nil {
		return
	}
	if g.req.includeUsage {
		if events.send(g.usageChunk()) != nil {
			return
		}
	}
	_ = events.done()
}

// abort cuts the connection after what was flushed: no final chunk, no [DONE], no terminating
// zero-length chunk. net/http closes the connection on this panic and does not log it.
func abort() {
	panic(http.ErrAbortHandler)
}

// opening is what a stream sends before the first token: for chat, the assistant role and, for a
// tool call, the call's id, type and name with empty arguments.
func (g *generation) opening(u *usage) []any {
	if g.req.endpoint == endpointCompletions {
		return nil
	}
	empty := ""
	chunks := []any{g.chatChunk(&chatDelta{Role: "assistant", Content: &empty}, nil, u)}
	if a := g.answer; a.toolName != "" {
		index := 0
		chunks = append(chunks, g.chatChunk(&chatDelta{ToolCalls: []toolCall{{
			Index:    &index,
			ID:       a.toolID,
			Type:     "function",
			Function: toolFunction{Name: a.toolName},
		}}}, nil, u))
	}
	return chunks
}

func (g *generation) pieceChunk(i int, u *usage) any {
	text := g.answer.piece(i)
	if g.req.endpoint == endpointCompletions {
		return g.textChunk(text, nil, u)
	}
	if g.answer.toolName != "" {
		index := 0
		return g.chatChunk(&chatDelta{ToolCalls: []toolCall{{
			Index:    &index,
			Function: toolFunction{Arguments: text},
		}}}, nil, u)
	}
	return g.chatChunk(&chatDelta{Content: &text}, nil, u)
}

func (g *generation) finishChunk(u *usage) any {
	finish := g.answer.finish
	if g.req.endpoint == endpointCompletions {
		return g.textChunk("", &finish, u)
	}
	return g.chatChunk(&chatDelta{}, &finish, u)
}

func (g *generation) usageChunk() any {
	u := g.usage(g.answer.count)
	if g.req.endpoint == endpointCompletions {
		return &textCompletion{ID: g.id, Object: "text_completion", Created: g.created, Model: g.req.model.Name, Choices: []textChoice{}, Usage: u}
	}
	return &chatCompletion{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.req.model.Name, Choices: []chatChoice{}, Usage: u}
}

func (g *generation) chatChunk(delta *chatDelta, finish *string, u *usage) *chatCompletion {
	return &chatCompletion{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.req.model.Name,
		Choices: []chatChoice{{Delta: delta, FinishReason: finish}},
		Usage:   u,
	}
}

func (g *generation) textChunk(text string, finish *string, u *usage) *textCompletion {
	return &textCompletion{
		ID: g.id, Object: "text_completion", Created: g.created, Model: g.req.model.Name,
		Choices: []textChoice{{Text: text, FinishReason: finish}},
		Usage:   u,
	}
}

// eventWriter writes server-sent events and flushes each one.
type eventWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *eventWriter) send(v any) error {
	return e.write(marshal(v))
}

func (e *eventWriter) done() error {
	return e.write([]byte("[DONE]"))
}

func (e *eventWriter) write(data []byte) error {
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := e.w.Write(buf); err != nil {
		return err
	}
	return e.rc.Flush()
}
