package gateway

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/openai"
)

// endpoint is one of the two inference endpoints.
type endpoint struct {
	name string // public path, recorded in usage events
	path string // path below a backend's /v1 base
	chat bool
}

var (
	chatEndpoint        = &endpoint{name: "/v1/chat/completions", path: "/chat/completions", chat: true}
	completionsEndpoint = &endpoint{name: "/v1/completions", path: "/completions"}
)

// request is a checked inference request: the client's bytes and what the gateway read of them.
type request struct {
	body         []byte
	fields       []openai.Field
	model        *catalog.Model
	stream       bool
	includeUsage bool   // the client asked for the usage chunk
	options      []byte // the client's stream_options object, nil when absent or null
	hasStream    bool   // the client sent a "stream" member
}

// check runs the endpoint checks of contract section 2, step 7. modelID is returned even when
// the check fails later, so that the usage event can name the model; an id longer than any in
// the catalog is returned cut to quoteLen bytes and "…", so that the record stays small and is
// never mistaken for a model's.
//
// The body is parsed once by ParseRequest, which refuses a member name written twice in any
// object at any depth, and its members and messages are then read from what that pass found
// (without looking for repeats again): what the checks below read of a nested object is what
// the backend reads.
func (g *Gateway) check(ep *endpoint, body []byte) (req request, modelID string, e *apiError) {
	var buf [16]openai.Field // room for a request's members: the request keeps a copy of their size
	fields, err := openai.ParseRequest(buf[:0], body)
	if err != nil {
		if errors.Is(err, openai.ErrDuplicateKey) {
			return req, "", invalid("", "", "Invalid JSON body: %v. Send each member once.", err)
		}
		return req, "", invalid("", "", "We could not parse the JSON body of your request (%v). Send a JSON object with Content-Type: application/json.", err)
	}
	req.body, req.fields = body, slices.Clone(fields)
	var in openai.ChatCompletionRequest
	in.Read(body, fields)

	// The model's name and the stream flag are read first so that the usage event of a request
	// refused later still says what it asked for.
	modelID, isString := openai.String(in.Model)
	if len(modelID) > catalog.MaxIDLen {
		// Never a model, and too long to record or quote: the event and the message get a prefix.
		return req, clip(modelID, quoteLen), errModelNotFound(modelID)
	}
	if in.Stream != nil {
		req.hasStream = true
		var known bool
		if req.stream, known = openai.Flag(in.Stream); !known {
			return req, modelID, invalid("stream", "invalid_type", "Invalid value for 'stream': expected a boolean (true or false), but got %s.", abbreviate(in.Stream))
		}
	}
	if in.Model == nil {
		return req, "", invalid("model", "missing_required_parameter", "Missing required parameter: 'model'.")
	}
	if !isString {
		return req, "", invalid("model", "invalid_type", "Invalid type for 'model': expected a string, but got %s instead.", kindName(in.Model))
	}
	m, ok := g.opt.Catalog.Model(modelID)
	if !ok {
		return req, modelID, errModelNotFound(modelID)
	}
	req.model = m

	if ov := in.StreamOptions; ov != nil && ov.Kind() != 'n' {
		if !req.stream {
			return req, modelID, invalid("stream_options", "invalid_value", "Invalid value for 'stream_options': stream_options is only allowed when 'stream' is true.")
		}
		if ov.Kind() != '{' {
			return req, modelID, invalid("stream_options", "invalid_type", "Invalid type for 'stream_options': expected an object, but got %s instead.", kindName(ov))
		}
		var opts openai.StreamOptions
		if err := openai.DecodeLast(ov, &opts); err != nil {
			return req, modelID, invalid("stream_options", "invalid_value", "Invalid 'stream_options': %v.", err)
		}
		if v := opts.IncludeUsage; v != nil {
			if k := v.Kind(); k != 't' && k != 'f' && k != 'n' {
				return req, modelID, invalid("stream_options.include_usage", "invalid_type", "Invalid type for 'stream_options.include_usage': expected a boolean, but got %s instead.", kindName(v))
			}
			req.includeUsage = v.Kind() == 't'
		}
		req.options = ov
	}

	if ep.chat {
		if e := checkChat(m, &in); e != nil {
			return req, modelID, e
		}
	}
	return req, modelID, nil
}

var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

func checkChat(m *catalog.Model, in *openai.ChatCompletionRequest) *apiError {
	if in.Messages.Kind() != '[' {
		return errEmptyMessages
	}
	var buf [8]openai.ChatCompletionMessage // room for a conversation's messages without allocating
	msgs, notObject, err := openai.ReadMessages(buf[:0], in.Messages)
	if err != nil {
		return nestedInvalid("messages", err) // not reached: the body's parse refused it
	}
	if len(msgs) == 0 && notObject == 0 {
		return errEmptyMessages
	}
	for i := range msgs {
		msg := &msgs[i]
		// The message's path, for an error: built only when one is found.
		at := func() string { return "messages[" + strconv.Itoa(i) + "]" }
		if msg.Role == nil {
			return invalid(at()+".role", "missing_required_parameter", "Missing required parameter: '%s.role'.", at())
		}
		role, ok := openai.String(msg.Role)
		if !ok || !roles[role] {
			return invalid(at()+".role", "invalid_value", "Invalid value for '%s.role': %s. Supported values are: 'system', 'developer', 'user', 'assistant', and 'tool'.", at(), abbreviate(msg.Role))
		}
		if role == "tool" {
			if msg.ToolCallID == nil {
				return invalid(at()+".tool_call_id", "missing_required_parameter", "Missing required parameter: '%s.tool_call_id'.", at())
			}
			if msg.ToolCallID.Kind() != '"' {
				return invalid(at()+".tool_call_id", "invalid_type", "Invalid type for '%s.tool_call_id': expected a string, but got %s instead.", at(), kindName(msg.ToolCallID))
			}
		}
		if msg.Content.Kind() == '[' {
			if e := checkParts(m, at()+".content", msg.Content); e != nil {
				return e
			}
		}
	}
	if notObject != 0 {
		at := "messages[" + strconv.Itoa(len(msgs)) + "]"
		return invalid(at, "invalid_type", "Invalid type for '%s': expected an object, but got %s instead.", at, kindOf(notObject))
	}

	if in.Tools != nil && in.Tools.Kind() != 'n' {
		if e := checkTools(in.Tools); e != nil {
			return e
		}
	}
	if tc := in.ToolChoice; tc != nil && !m.ForcedToolChoice {
		forced := tc.Kind() == '{'
		if s, ok := openai.String(tc); ok && s == "required" {
			forced = true
		}
		if forced {
			return invalid("tool_choice", "unsupported_parameter", "Unsupported value: forced tool choice (tool_choice %s) is not supported with model %s. Send tool_choice \"auto\".", abbreviate(tc), m.ID)
		}
	}
	if re := in.ReasoningEffort; re != nil && re.Kind() != 'n' {
		s, _ := openai.String(re)
		if s != "low" && s != "medium" && s != "high" {
			return invalid("reasoning_effort", "invalid_value", "Invalid value for 'reasoning_effort': %s. Supported values are: 'low', 'medium', and 'high'.", abbreviate(re))
		}
	}
	if ie := in.IgnoreEOS; ie != nil && !m.IgnoreEOS {
		// Read as the backend reads it (as stream is): "true" and 1 are true. A form the gateway
		// does not read, which the backend might take for true ("yes", 1.0), is refused too.
		b, known := openai.Flag(ie)
		if !known {
			return invalid("ignore_eos", "invalid_type", "Invalid value for 'ignore_eos': expected a boolean (true or false), but got %s.", abbreviate(ie))
		}
		if b {
			return invalid("ignore_eos", "unsupported_parameter", "Unsupported parameter: 'ignore_eos' is not supported with model %s.", m.ID)
		}
	}
	return nil
}

// checkParts refuses content parts the model cannot take (images on a text-only model).
func checkParts(m *catalog.Model, at string, content jsontext.Value) *apiError {
	var parts []jsontext.Value
	if err := openai.DecodeLast(content, &parts); err != nil {
		return nestedInvalid(at, err) // not reached: the body's parse refused it
	}
	for i, raw := range parts {
		if raw.Kind() != '{' {
			continue
		}
		var part openai.ContentPart
		if err := openai.DecodeLast(raw, &part); err != nil {
			return nestedInvalid(fmt.Sprintf("%s[%d]", at, i), err)
		}
		typ, _ := openai.String(part.Type)
		if need := partModality[typ]; need != "" && !slices.Contains(m.InputModalities, need) {
			p := fmt.Sprintf("%s[%d]", at, i)
			return invalid(p, "unsupported_value", "Invalid content part '%s': model %s does not accept %s input.", p, m.ID, need)
		}
	}
	return nil
}

// partModality is the input modality a content part of each type needs, beyond text.
var partModality = map[string]string{"image_url": "image", "input_audio": "audio"}

func checkTools(raw jsontext.Value) *apiError {
	if raw.Kind() != '[' {
		return invalid("tools", "invalid_type", "Invalid type for 'tools': expected an array, but got %s instead.", kindName(raw))
	}
	var tools []jsontext.Value
	if err := openai.DecodeLast(raw, &tools); err != nil {
		return invalid("tools", "invalid_type", "Invalid 'tools': %v.", err)
	}
	for i, raw := range tools {
		at := func() string { return "tools[" + strconv.Itoa(i) + "]" }
		if raw.Kind() != '{' {
			return invalid(at(), "invalid_type", "Invalid type for '%s': expected an object, but got %s instead.", at(), kindName(raw))
		}
		var tool openai.Tool
		if err := openai.DecodeLast(raw, &tool); err != nil {
			return nestedInvalid(at(), err)
		}
		if tool.Type != nil {
			if typ, _ := openai.String(tool.Type); typ != "function" {
				continue // other tool kinds are the model server's to judge
			}
		}
		if tool.Function.Kind() != '{' {
			return invalid(at()+".function", "missing_required_parameter", "Missing required parameter: '%s.function'.", at())
		}
		var fn openai.FunctionDefinition
		if err := openai.DecodeLast(tool.Function, &fn); err != nil {
			return nestedInvalid(at()+".function", err)
		}
		if name, _ := openai.String(fn.Name); name == "" {
			return invalid(at()+".function.name", "missing_required_parameter", "Missing required parameter: '%s.function.name'.", at())
		}
		if desc, _ := openai.String(fn.Description); desc == "" {
			return invalid(at()+".function.description", "", "Invalid '%s.function': a function tool must have a non-empty 'description'.", at())
		}
	}
	return nil
}

// forward returns the body sent to backend b: the client's bytes with the model renamed,
// stream as a JSON boolean and, when streaming, include_usage (and continuous usage where the
// backend has it) forced on. Nothing else changes.
func (req *request) forward(b catalog.Backend) []byte {
	edits := make([]openai.Edit, 0, 3)
	if b.Model != req.model.ID {
		edits = append(edits, openai.Edit{Key: "model", Value: []byte(strconv.Quote(b.Model))})
	}
	if req.hasStream {
		edits = append(edits, openai.Edit{Key: "stream", Value: strconv.AppendBool(nil, req.stream)})
	}
	if req.stream {
		opts := []openai.Edit{{Key: "include_usage", Value: []byte("true")}}
		if b.ContinuousUsage {
			opts = append(opts, openai.Edit{Key: "continuous_usage_stats", Value: []byte("true")})
		}
		so := []byte("{}")
		ofs, _ := openai.ParseRequest(nil, req.options) // nil options: none, and an empty object to fill
		if req.options != nil {
			so = req.options
		}
		so = openai.Rewrite(nil, so, ofs, opts...)
		edits = append(edits, openai.Edit{Key: "stream_options", Value: so})
	}
	if len(edits) == 0 {
		return req.body
	}
	return openai.Rewrite(make([]byte, 0, len(req.body)+96), req.body, req.fields, edits...)
}

// kindName names a JSON value's type the way OpenAI's errors do.
func kindName(v jsontext.Value) string { return kindOf(v.Kind()) }

// kindOf names a kind of JSON value the way OpenAI's errors do.
func kindOf(k jsontext.Kind) string {
	switch k {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// abbreviate quotes a client's value in an error message, cut to a readable length.
func abbreviate(v []byte) string {
	const max = 40
	if len(v) > max+utf8.UTFMax {
		v = v[:max+utf8.UTFMax] // clip needs only the bytes up to the cut
	}
	return clip(string(v), max)
}

// nestedInvalid refuses a nested object or array that does not parse. ParseRequest has validated
// the whole body, duplicate names at every depth included, before any check reads a nested value:
// this is the answer should that ever change, never a silent pass.
func nestedInvalid(at string, err error) *apiError {
	if errors.Is(err, openai.ErrDuplicateKey) {
		return invalid(at, "", "Invalid JSON body: %v in '%s'. Send each member once.", err, at)
	}
	return invalid(at, "", "Invalid JSON body: '%s' could not be parsed (%v).", at, err)
}
