package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

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
// the catalog is returned as recordedModel makes it, bounded.
//
// The body is parsed once, by ParseRequest, which refuses a member name written twice in any
// object at any depth: what the checks below read of a nested object is what the backend reads.
func (g *Gateway) check(ep *endpoint, body []byte) (req request, modelID string, e *apiError) {
	fields, err := openai.ParseRequest(nil, body)
	if err != nil {
		if errors.Is(err, openai.ErrDuplicateKey) {
			return req, "", invalid("", "", "Invalid JSON body: %v. Send each member once.", err)
		}
		return req, "", invalid("", "", "We could not parse the JSON body of your request (%v). Send a JSON object with Content-Type: application/json.", err)
	}
	req.body, req.fields = body, fields
	get := func(key string) ([]byte, bool) {
		f, ok := openai.Lookup(body, fields, key)
		if !ok {
			return nil, false
		}
		return f.Value(body), true
	}

	// The model's name and the stream flag are read first so that the usage event of a request
	// refused later still says what it asked for.
	mv, hasModel := get("model")
	modelID, isString := openai.Unquote(mv)
	if len(modelID) > catalog.MaxIDLen {
		// Never a model, and too long to record or quote: the event and the message get a prefix.
		return req, recordedModel(modelID), errModelNotFound(modelID)
	}
	if sv, ok := get("stream"); ok {
		req.hasStream = true
		var known bool
		if req.stream, known = openai.Flag(sv); !known {
			return req, modelID, invalid("stream", "invalid_type", "Invalid value for 'stream': expected a boolean (true or false), but got %s.", abbreviate(sv))
		}
	}
	if !hasModel {
		return req, "", invalid("model", "missing_required_parameter", "Missing required parameter: 'model'.")
	}
	if !isString {
		return req, "", invalid("model", "invalid_type", "Invalid type for 'model': expected a string, but got %s instead.", kindName(mv))
	}
	m, ok := g.opt.Catalog.Model(modelID)
	if !ok {
		return req, modelID, errModelNotFound(modelID)
	}
	req.model = m

	if ov, ok := get("stream_options"); ok && !openai.IsNull(ov) {
		if !req.stream {
			return req, modelID, invalid("stream_options", "invalid_value", "Invalid value for 'stream_options': stream_options is only allowed when 'stream' is true.")
		}
		if openai.Kind(ov) != '{' {
			return req, modelID, invalid("stream_options", "invalid_type", "Invalid type for 'stream_options': expected an object, but got %s instead.", kindName(ov))
		}
		ofs, err := openai.ParseObject(nil, ov)
		if err != nil {
			return req, modelID, invalid("stream_options", "invalid_value", "Invalid 'stream_options': %v.", err)
		}
		if f, ok := openai.Lookup(ov, ofs, "include_usage"); ok {
			v := f.Value(ov)
			b, isBool := openai.Bool(v)
			if !isBool && !openai.IsNull(v) {
				return req, modelID, invalid("stream_options.include_usage", "invalid_type", "Invalid type for 'stream_options.include_usage': expected a boolean, but got %s instead.", kindName(v))
			}
			req.includeUsage = b
		}
		req.options = ov
	}

	if ep.chat {
		if e := checkChat(m, get); e != nil {
			return req, modelID, e
		}
	}
	return req, modelID, nil
}

var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

func checkChat(m *catalog.Model, get func(string) ([]byte, bool)) *apiError {
	msgs, ok := get("messages")
	if !ok || openai.Kind(msgs) != '[' {
		return errEmptyMessages
	}
	elems, err := openai.Elements(nil, msgs)
	if err != nil || len(elems) == 0 {
		return errEmptyMessages
	}
	var buf [8]openai.Field // room for a message's members without allocating
	fields := buf[:0]
	for i, span := range elems {
		msg := msgs[span[0]:span[1]]
		// The message's path, for an error: built only when one is found.
		at := func() string { return "messages[" + strconv.Itoa(i) + "]" }
		if openai.Kind(msg) != '{' {
			return invalid(at(), "invalid_type", "Invalid type for '%s': expected an object, but got %s instead.", at(), kindName(msg))
		}
		if fields, err = openai.ParseObject(fields[:0], msg); err != nil {
			return nestedInvalid(at(), err) // not reached: the body's parse refused it
		}
		rf, ok := openai.Lookup(msg, fields, "role")
		if !ok {
			return invalid(at()+".role", "missing_required_parameter", "Missing required parameter: '%s.role'.", at())
		}
		role, ok := openai.Unquote(rf.Value(msg))
		if !ok || !roles[role] {
			return invalid(at()+".role", "invalid_value", "Invalid value for '%s.role': %s. Supported values are: 'system', 'developer', 'user', 'assistant', and 'tool'.", at(), abbreviate(rf.Value(msg)))
		}
		if role == "tool" {
			tf, ok := openai.Lookup(msg, fields, "tool_call_id")
			if !ok {
				return invalid(at()+".tool_call_id", "missing_required_parameter", "Missing required parameter: '%s.tool_call_id'.", at())
			}
			if _, ok := openai.Unquote(tf.Value(msg)); !ok {
				return invalid(at()+".tool_call_id", "invalid_type", "Invalid type for '%s.tool_call_id': expected a string, but got %s instead.", at(), kindName(tf.Value(msg)))
			}
		}
		if cf, ok := openai.Lookup(msg, fields, "content"); ok && openai.Kind(cf.Value(msg)) == '[' {
			if e := checkParts(m, at()+".content", cf.Value(msg)); e != nil {
				return e
			}
		}
	}

	if tools, ok := get("tools"); ok && !openai.IsNull(tools) {
		if e := checkTools(tools); e != nil {
			return e
		}
	}
	if tc, ok := get("tool_choice"); ok && !m.ForcedToolChoice {
		forced := openai.Kind(tc) == '{'
		if s, ok := openai.Unquote(tc); ok && s == "required" {
			forced = true
		}
		if forced {
			return invalid("tool_choice", "unsupported_parameter", "Unsupported value: forced tool choice (tool_choice %s) is not supported with model %s. Send tool_choice \"auto\".", abbreviate(tc), m.ID)
		}
	}
	if re, ok := get("reasoning_effort"); ok && !openai.IsNull(re) {
		s, _ := openai.Unquote(re)
		if s != "low" && s != "medium" && s != "high" {
			return invalid("reasoning_effort", "invalid_value", "Invalid value for 'reasoning_effort': %s. Supported values are: 'low', 'medium', and 'high'.", abbreviate(re))
		}
	}
	if ie, ok := get("ignore_eos"); ok && !m.IgnoreEOS {
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
func checkParts(m *catalog.Model, at string, parts []byte) *apiError {
	elems, err := openai.Elements(nil, parts)
	if err != nil {
		return nestedInvalid(at, err) // not reached: the body's parse refused it
	}
	var fields []openai.Field
	for i, span := range elems {
		part := parts[span[0]:span[1]]
		if openai.Kind(part) != '{' {
			continue
		}
		if fields, err = openai.ParseObject(fields[:0], part); err != nil {
			return nestedInvalid(fmt.Sprintf("%s[%d]", at, i), err)
		}
		tf, ok := openai.Lookup(part, fields, "type")
		if !ok {
			continue
		}
		typ, _ := openai.Unquote(tf.Value(part))
		need := map[string]string{"image_url": "image", "input_audio": "audio"}[typ]
		if need != "" && !hasModality(m, need) {
			p := fmt.Sprintf("%s[%d]", at, i)
			return invalid(p, "unsupported_value", "Invalid content part '%s': model %s does not accept %s input.", p, m.ID, need)
		}
	}
	return nil
}

func hasModality(m *catalog.Model, kind string) bool {
	for _, k := range m.InputModalities {
		if k == kind {
			return true
		}
	}
	return false
}

func checkTools(tools []byte) *apiError {
	if openai.Kind(tools) != '[' {
		return invalid("tools", "invalid_type", "Invalid type for 'tools': expected an array, but got %s instead.", kindName(tools))
	}
	elems, err := openai.Elements(nil, tools)
	if err != nil {
		return invalid("tools", "invalid_type", "Invalid 'tools': %v.", err)
	}
	var fields, fn []openai.Field
	for i, span := range elems {
		tool := tools[span[0]:span[1]]
		at := func() string { return "tools[" + strconv.Itoa(i) + "]" }
		if openai.Kind(tool) != '{' {
			return invalid(at(), "invalid_type", "Invalid type for '%s': expected an object, but got %s instead.", at(), kindName(tool))
		}
		if fields, err = openai.ParseObject(fields[:0], tool); err != nil {
			return nestedInvalid(at(), err)
		}
		if tf, ok := openai.Lookup(tool, fields, "type"); ok {
			if typ, _ := openai.Unquote(tf.Value(tool)); typ != "function" {
				continue // other tool kinds are the model server's to judge
			}
		}
		ff, ok := openai.Lookup(tool, fields, "function")
		if !ok || openai.Kind(ff.Value(tool)) != '{' {
			return invalid(at()+".function", "missing_required_parameter", "Missing required parameter: '%s.function'.", at())
		}
		fv := ff.Value(tool)
		if fn, err = openai.ParseObject(fn[:0], fv); err != nil {
			return nestedInvalid(at()+".function", err)
		}
		nf, ok := openai.Lookup(fv, fn, "name")
		if name, isStr := openai.Unquote(nf.Value(fv)); !ok || !isStr || name == "" {
			return invalid(at()+".function.name", "missing_required_parameter", "Missing required parameter: '%s.function.name'.", at())
		}
		df, ok := openai.Lookup(fv, fn, "description")
		if desc, isStr := openai.Unquote(df.Value(fv)); !ok || !isStr || desc == "" {
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
		v := []byte("false")
		if req.stream {
			v = []byte("true")
		}
		edits = append(edits, openai.Edit{Key: "stream", Value: v})
	}
	if req.stream {
		opts := []openai.Edit{{Key: "include_usage", Value: []byte("true")}}
		if b.ContinuousUsage {
			opts = append(opts, openai.Edit{Key: "continuous_usage_stats", Value: []byte("true")})
		}
		var so []byte
		if req.options != nil {
			ofs, _ := openai.ParseObject(nil, req.options)
			so = openai.Rewrite(nil, req.options, ofs, opts...)
		} else {
			so = openai.Rewrite(nil, []byte("{}"), nil, opts...)
		}
		edits = append(edits, openai.Edit{Key: "stream_options", Value: so})
	}
	if len(edits) == 0 {
		return req.body
	}
	return openai.Rewrite(make([]byte, 0, len(req.body)+96), req.body, req.fields, edits...)
}

// kindName names a JSON value's type the way OpenAI's errors do.
func kindName(v []byte) string {
	switch openai.Kind(v) {
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

// nestedInvalid refuses a nested object or array that does not parse. ParseObject has validated
// the whole body, duplicate names at every depth included, before any check reads a nested value:
// this is the answer should that ever change, never a silent pass.
func nestedInvalid(at string, err error) *apiError {
	if errors.Is(err, openai.ErrDuplicateKey) {
		return invalid(at, "", "Invalid JSON body: %v in '%s'. Send each member once.", err, at)
	}
	return invalid(at, "", "Invalid JSON body: '%s' could not be parsed (%v).", at, err)
}

// recordedModel is what the usage event records of a model id longer than any catalog id: its
// first bytes and "…", so that the record stays small and is never mistaken for a model's.
func recordedModel(id string) string { return clip(id, quoteLen) }
