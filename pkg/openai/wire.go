package openai

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// The wire types below are named as OpenAI's API reference names them
// (https://platform.openai.com/docs/api-reference/chat) and hold what the gateway reads; Decode
// skips every other member, and the gateway forwards the client's bytes, not these values. A
// member the gateway checks the type of is kept as written (a jsontext.Value, nil when absent),
// so that a wrong type is the gateway's 400 with the member's path rather than a decoding error.

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	Model           jsontext.Value `json:"model,omitzero"`
	Stream          jsontext.Value `json:"stream,omitzero"`
	StreamOptions   jsontext.Value `json:"stream_options,omitzero"`
	Messages        jsontext.Value `json:"messages,omitzero"`
	Tools           jsontext.Value `json:"tools,omitzero"`
	ToolChoice      jsontext.Value `json:"tool_choice,omitzero"`
	ReasoningEffort jsontext.Value `json:"reasoning_effort,omitzero"`
	IgnoreEOS       jsontext.Value `json:"ignore_eos,omitzero"` // vLLM's and SGLang's extension
}

// StreamOptions is a request's stream_options.
type StreamOptions struct {
	IncludeUsage jsontext.Value `json:"include_usage,omitzero"`
}

// ChatCompletionMessage is one element of a chat request's messages.
type ChatCompletionMessage struct {
	Role       jsontext.Value `json:"role,omitzero"`
	ToolCallID jsontext.Value `json:"tool_call_id,omitzero"`
	Content    jsontext.Value `json:"content,omitzero"` // a string, or an array of ContentPart
}

// Read sets r's members from fields, the members of raw that ParseRequest returned: what
// Decode reads of a body, without reading it again.
func (r *ChatCompletionRequest) Read(raw []byte, fields []Field) {
	for _, f := range fields {
		var member *jsontext.Value
		switch string(f.name(raw)) {
		case "model":
			member = &r.Model
		case "stream":
			member = &r.Stream
		case "stream_options":
			member = &r.StreamOptions
		case "messages":
			member = &r.Messages
		case "tools":
			member = &r.Tools
		case "tool_choice":
			member = &r.ToolChoice
		case "reasoning_effort":
			member = &r.ReasoningEffort
		case "ignore_eos":
			member = &r.IgnoreEOS
		default:
			continue
		}
		*member = f.Value(raw)
	}
}

// ReadMessages reads a chat request's messages, an array that ParseRequest has checked, into
// dst[:0] in one pass, as Decode reads each element. It stops at the first element that is not
// an object and returns its kind (0 when every element is one).
func ReadMessages(dst []ChatCompletionMessage, messages jsontext.Value) ([]ChatCompletionMessage, jsontext.Kind, error) {
	dst = dst[:0]
	if len(messages) == 0 || messages[0] != '[' {
		return dst, 0, fmt.Errorf("expected an array, found %v", messages.Kind())
	}
	var notObject jsontext.Kind
	_, err := readElements(messages, 0, func(at int) (int, error) {
		if k := messages[at:].Kind(); k != '{' {
			notObject = k
			return len(messages), nil // the first element that is not an object ends the reading
		}
		dst = append(dst, ChatCompletionMessage{})
		m := &dst[len(dst)-1]
		return readMembers(messages, at, func(name []byte, at int) (int, error) {
			end := skipValue(messages, at)
			switch string(name) {
			case "role":
				m.Role = messages[at:end:end]
			case "tool_call_id":
				m.ToolCallID = messages[at:end:end]
			case "content":
				m.Content = messages[at:end:end]
			}
			return end, nil
		})
	})
	return dst, notObject, err
}

// ContentPart is one element of a message's content array: text, image_url, input_audio, file.
type ContentPart struct {
	Type jsontext.Value `json:"type,omitzero"`
}

// Tool is one element of a chat request's tools.
type Tool struct {
	Type     jsontext.Value `json:"type,omitzero"`
	Function jsontext.Value `json:"function,omitzero"` // a FunctionDefinition
}

// FunctionDefinition is a function tool's function.
type FunctionDefinition struct {
	Name        jsontext.Value `json:"name,omitzero"`
	Description jsontext.Value `json:"description,omitzero"`
}

// ChatCompletion is a non-streamed answer of either endpoint (object "chat.completion" or
// "text_completion"); Usage is kept as written, for ParseUsage and for the cost added to it.
type ChatCompletion struct {
	Choices []Choice       `json:"choices"`
	Usage   jsontext.Value `json:"usage,omitzero"`
}

// Choice is one element of a non-streamed answer's choices.
type Choice struct {
	FinishReason string `json:"finish_reason,omitzero"` // "" unless a string
}

// member reads an answer's choices (when an array) and usage, as ChatCompletionChunk's does.
func (c *ChatCompletion) member(raw []byte, f Field) (end int, err error) {
	switch string(f.name(raw)) {
	case "choices":
		if raw[f.ValueStart] == '[' {
			c.Choices, end, err = readArray(raw, f.ValueStart, c.Choices[:0])
			return end, err
		}
	case "usage":
		c.Usage, end = valueAt(raw, f.ValueStart)
		return end, nil
	}
	return skipValue(raw, f.ValueStart), nil
}

// UnmarshalJSONFrom reads a choice.
func (c *Choice) UnmarshalJSONFrom(dec *jsontext.Decoder) error { return readValue(dec, c.read) }

// read reads a choice, the object at v[i]: of its members, only finish_reason, and only a string.
func (c *Choice) read(v []byte, i int) (end int, err error) {
	*c = Choice{}
	return readMembers(v, i, func(name []byte, at int) (int, error) {
		end := skipValue(v, at)
		if string(name) == "finish_reason" {
			c.FinishReason, _ = String(v[at:end]) // of a name written twice, the last counts
		}
		return end, nil
	})
}

// ChatCompletionChunk is one streamed event of either endpoint (object "chat.completion.chunk"
// or "text_completion").
type ChatCompletionChunk struct {
	Choices []ChunkChoice `json:"choices"`
	// Usage is kept as written, for ParseUsage and the cost added to it; after ParseChunk it
	// is the chunk's own bytes, valid as long as they are.
	Usage jsontext.Value `json:"usage,omitzero"`
	// Error is an error event's error, kept as written: vLLM ends a stream that fails with
	// {"error": {...}} in place of a chunk.
	Error jsontext.Value `json:"error,omitzero"`
}

// ChunkChoice is one element of a chunk's choices: Delta for chat, Text for completions.
type ChunkChoice struct {
	Index        int        `json:"index"` // -1 when not a non-negative integer
	Delta        ChunkDelta `json:"delta,omitzero"`
	Text         string     `json:"text,omitzero"`
	FinishReason string     `json:"finish_reason,omitzero"` // "" while null
}

// ChunkDelta is a chat chunk's delta; reasoning_content is vLLM's and SGLang's name for
// reasoning, reasoning the newer one. ToolCalls is kept as written: the gateway only needs to
// know whether it holds any.
type ChunkDelta struct {
	Content          string         `json:"content,omitzero"`
	ReasoningContent string         `json:"reasoning_content,omitzero"`
	Reasoning        string         `json:"reasoning,omitzero"`
	ToolCalls        jsontext.Value `json:"tool_calls,omitzero"`
}

// Generated reports whether the delta carries generated content: text, reasoning, or tool-call
// fragments.
func (d *ChunkDelta) Generated() bool {
	return d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" || len(d.ToolCalls) > 2 && d.ToolCalls.Kind() != 'n'
}

// A relay reads every chunk's choices, so ChunkChoice and ChunkDelta read their members from the
// text the library has validated themselves (see readMembers): json.Unmarshal's reflection took
// three times as long on a typical choice (BenchmarkDecodeChunkChoices). Both start afresh, so
// that of a member written twice, which the client's JSON parser reads as the last one, nothing
// of the first remains.

// member reads a chunk's choices (when an array: an element that is not an object reads as a
// choice without members), usage and error.
func (c *ChatCompletionChunk) member(raw []byte, f Field) (end int, err error) {
	switch string(f.name(raw)) {
	case "choices":
		if raw[f.ValueStart] == '[' {
			c.Choices, end, err = readArray(raw, f.ValueStart, c.Choices[:0])
			return end, err
		}
	case "usage":
		c.Usage, end = valueAt(raw, f.ValueStart)
		return end, nil
	case "error":
		c.Error, end = valueAt(raw, f.ValueStart)
		return end, nil
	}
	return skipValue(raw, f.ValueStart), nil
}

// valueAt returns the valid value that starts at raw[i], capped at its end, and where it ends.
func valueAt(raw []byte, i int) (jsontext.Value, int) {
	end := skipValue(raw, i)
	return raw[i:end:end], end
}

// readArray appends the elements of the valid array at v[i] to dst and returns where the array
// ends. An element that is not an object reads as the zero value.
func readArray[T any, PT interface {
	*T
	read(v []byte, i int) (end int, err error)
}](v []byte, i int, dst []T) ([]T, int, error) {
	end, err := readElements(v, i, func(at int) (int, error) {
		var zero T
		dst = append(dst, zero)
		if v[at] != '{' {
			return skipValue(v, at), nil
		}
		return PT(&dst[len(dst)-1]).read(v, at)
	})
	return dst, end, err
}

// readValue reads the next value of dec with read, so that a wire type reads a value the same
// way whether Decode or ParseChunk hands it over.
func readValue(dec *jsontext.Decoder, read func(v []byte, i int) (int, error)) error {
	v, err := dec.ReadValue()
	if err == nil {
		_, err = read(v, 0)
	}
	return err
}

// UnmarshalJSONFrom reads a choice.
func (c *ChunkChoice) UnmarshalJSONFrom(dec *jsontext.Decoder) error { return readValue(dec, c.read) }

// read reads a choice, the object at v[i].
func (c *ChunkChoice) read(v []byte, i int) (end int, err error) {
	*c = ChunkChoice{}
	return readMembers(v, i, func(name []byte, at int) (int, error) {
		if string(name) == "delta" {
			return c.Delta.read(v, at)
		}
		end := skipValue(v, at)
		switch value := v[at:end]; string(name) {
		case "index":
			var err error
			if c.Index, err = strconv.Atoi(string(value)); err != nil || c.Index < 0 {
				c.Index = -1
			}
		case "text":
			c.Text = text(value)
		case "finish_reason":
			c.FinishReason = text(value)
		}
		return end, nil
	})
}

// UnmarshalJSONFrom reads a delta.
func (d *ChunkDelta) UnmarshalJSONFrom(dec *jsontext.Decoder) error { return readValue(dec, d.read) }

// read reads a delta, the object at v[i].
func (d *ChunkDelta) read(v []byte, i int) (end int, err error) {
	*d = ChunkDelta{}
	return readMembers(v, i, func(name []byte, at int) (int, error) {
		end := skipValue(v, at)
		switch value := v[at:end]; string(name) {
		case "content":
			d.Content = text(value)
		case "reasoning_content":
			d.ReasoningContent = text(value)
		case "reasoning":
			d.Reasoning = text(value)
		case "tool_calls":
			d.ToolCalls = append(d.ToolCalls[:0], value...) // a decoder's bytes last only until its next read
		}
		return end, nil
	})
}

// text reads a string member; any other value reads as "" unless it holds something (an array
// of content parts), which reads as written.
func text(v jsontext.Value) string {
	if s, ok := String(v); ok {
		return s
	}
	if len(v) <= 2 || v.Kind() == 'n' {
		return ""
	}
	return string(v)
}

// Usage is a usage object's token counts (CompletionUsage in OpenAI's reference).
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// PromptTokensDetails.CachedTokens is 0 when the server reports none.
	PromptTokensDetails PromptTokensDetails `json:"prompt_tokens_details,omitzero"`
}

// PromptTokensDetails is a usage object's prompt_tokens_details.
type PromptTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// ErrorResponse is an error body as model servers write it: vLLM's and OpenAI's
// {"error":{...}}, SGLang's flat {"object":"error","message",...}, FastAPI's {"detail":...}.
// Error and Detail are kept as written: their shapes vary by server.
type ErrorResponse struct {
	Error jsontext.Value `json:"error,omitzero"`
	ErrorBody
}

// ErrorBody is the inside of an error response (or a flat one). Code is a string (OpenAI) or an
// HTTP status (vLLM, SGLang).
type ErrorBody struct {
	Message jsontext.Value `json:"message,omitzero"`
	Param   jsontext.Value `json:"param,omitzero"`
	Code    jsontext.Value `json:"code,omitzero"`
	Detail  jsontext.Value `json:"detail,omitzero"`
}

// Flag reads v, a JSON value given for a boolean request flag, as model servers read it and
// returns whether the value is one of the forms the gateway accepts at all: true, "true" and 1
// are true; false, "false", 0 and null are false. vLLM and SGLang validate their requests with
// pydantic in lax mode, which reads those forms the same way (null as "not given") but also takes
// 1.0, "1", "yes", "on", "t", "y" and their capitalised forms as true; such a value gets ok false,
// so that a caller refuses it rather than forward a flag the backend would read differently.
func Flag(v jsontext.Value) (val, ok bool) {
	switch string(v) {
	case "true", `"true"`, "1":
		return true, true
	case "false", `"false"`, "0", "null":
		return false, true
	}
	return false, false
}

// String decodes v if it is a JSON string. Invalid UTF-8 and unpaired surrogates become U+FFFD,
// as with encoding/json.
func String(v jsontext.Value) (s string, ok bool) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && simple(v[1:len(v)-1]) {
		return string(v[1 : len(v)-1]), true
	}
	if v.Kind() != '"' {
		return "", false
	}
	return decodeString(v)
}

// decodeString is String for a string with escapes or beyond printable ASCII. It is apart from
// String because the string that Decode reads into is allocated, whether it is read or not.
func decodeString(v jsontext.Value) (s string, ok bool) {
	return s, Decode(v, &s) == nil
}

// simple reports whether text between a string's quotes decodes to itself: printable ASCII
// without escapes or quotes, which is most of what a request's strings hold.
func simple(text []byte) bool {
	for _, c := range text {
		if c < ' ' || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
