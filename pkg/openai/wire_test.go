package openai

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// payloads reads a recorded payload from testdata/wire: a JSON file's text after its comment
// lines, or every data event of an SSE file but [DONE].
func payloads(t *testing.T, file string) [][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "wire", file))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(file, ".sse") {
		var text []byte
		for line := range bytes.Lines(raw) {
			if !bytes.HasPrefix(line, []byte("#")) {
				text = append(text, line...)
			}
		}
		return [][]byte{bytes.TrimSpace(text)}
	}
	var out [][]byte
	d := NewDecoder(bytes.NewReader(raw))
	for {
		ev, err := d.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Data != nil && !IsDone(ev.Data) {
			out = append(out, append([]byte(nil), ev.Data...))
		}
	}
}

// within reports where got, a decoded JSON value, is not part of want: every member of an object
// in got must be in want with a value within want's, arrays must match element by element.
func within(got, want any, at string) string {
	switch g := got.(type) {
	case map[string]any:
		w, ok := want.(map[string]any)
		if !ok {
			return at + ": an object where the payload has none"
		}
		for k, v := range g {
			wv, ok := w[k]
			if !ok {
				return at + "." + k + ": not in the payload"
			}
			if d := within(v, wv, at+"."+k); d != "" {
				return d
			}
		}
	case []any:
		w, ok := want.([]any)
		if !ok || len(w) != len(g) {
			return at + ": not the payload's array"
		}
		for i := range g {
			if d := within(g[i], w[i], at+"[]"); d != "" {
				return d
			}
		}
	default:
		if !reflect.DeepEqual(got, want) {
			return at + ": differs from the payload"
		}
	}
	return ""
}

// TestWireTypesRoundTrip decodes recorded payloads (the simulator's vLLM and SGLang answers,
// chunks and errors; vLLM's and FastAPI's error bodies) into their wire types and encodes them
// again: what the types read is in the payload as the payload has it, and decoding the
// re-encoded value gives the same value. The checks then read the members the gateway reads.
func TestWireTypesRoundTrip(t *testing.T) {
	tests := []struct {
		file  string
		new   func() any
		check func(t *testing.T, v any)
	}{
		{"chat-request.json", func() any { return new(ChatCompletionRequest) }, func(t *testing.T, v any) {
			r := v.(*ChatCompletionRequest)
			var msgs []ChatCompletionMessage
			if err := Decode(r.Messages, &msgs); err != nil || len(msgs) != 4 {
				t.Fatalf("messages: %v, %d", err, len(msgs))
			}
			var parts []ContentPart
			if err := Decode(msgs[1].Content, &parts); err != nil || string(parts[1].Type) != `"image_url"` {
				t.Errorf("content parts: %v, %+v", err, parts)
			}
			if string(msgs[3].ToolCallID) != `"call_1"` {
				t.Errorf("tool_call_id = %s", msgs[3].ToolCallID)
			}
			var tools []Tool
			var fn FunctionDefinition
			if err := Decode(r.Tools, &tools); err != nil || Decode(tools[0].Function, &fn) != nil || string(fn.Description) != `"Get the weather of a city."` {
				t.Errorf("tools: %v, %+v", err, fn)
			}
			var opts StreamOptions
			if stream, _ := Flag(r.Stream); !stream || Decode(r.StreamOptions, &opts) != nil || string(opts.IncludeUsage) != "true" {
				t.Errorf("stream %s, stream_options %s", r.Stream, r.StreamOptions)
			}
		}},
		{"vllm-chat-completion.json", func() any { return new(ChatCompletion) }, func(t *testing.T, v any) {
			c := v.(*ChatCompletion)
			u, ok, err := ParseUsage(c.Usage)
			if c.Choices[0].FinishReason != "stop" || !ok || err != nil || u != (Usage{9, 8, 17, PromptTokensDetails{0}}) {
				t.Errorf("%+v, usage %+v %v", c.Choices, u, err)
			}
		}},
		{"sglang-chat-completion.json", func() any { return new(ChatCompletion) }, func(t *testing.T, v any) {
			if c := v.(*ChatCompletion); c.Choices[0].FinishReason != "stop" || c.Usage == nil {
				t.Errorf("%+v", c)
			}
		}},
		{"vllm-text-completion.json", func() any { return new(ChatCompletion) }, func(t *testing.T, v any) {
			if c := v.(*ChatCompletion); c.Choices[0].FinishReason != "stop" || c.Usage == nil {
				t.Errorf("%+v", c)
			}
		}},
		{"sglang-text-completion.json", func() any { return new(ChatCompletion) }, nil},
		{"vllm-chat-stream.sse", func() any { return new(ChatCompletionChunk) }, nil},
		{"sglang-chat-stream.sse", func() any { return new(ChatCompletionChunk) }, nil},
		{"vllm-text-stream.sse", func() any { return new(ChatCompletionChunk) }, nil},
		{"sglang-text-stream.sse", func() any { return new(ChatCompletionChunk) }, nil},
		{"vllm-error-unknown-model.json", func() any { return new(ErrorResponse) }, func(t *testing.T, v any) {
			if e := v.(*ErrorResponse); e.Error.Kind() != '{' {
				t.Errorf("%+v", e)
			}
		}},
		{"sglang-error-unknown-model.json", func() any { return new(ErrorResponse) }, func(t *testing.T, v any) {
			if e := v.(*ErrorResponse); string(e.Code) != "404" || e.Message.Kind() != '"' {
				t.Errorf("%+v", e)
			}
		}},
		{"sglang-flat.json", func() any { return new(ErrorResponse) }, func(t *testing.T, v any) {
			if e := v.(*ErrorResponse); string(e.Code) != "400" || string(e.Param) != "null" {
				t.Errorf("%+v", e)
			}
		}},
		{"vllm-validation-parameter.json", func() any { return new(ErrorResponse) }, func(t *testing.T, v any) {
			var body ErrorBody
			if e := v.(*ErrorResponse); Decode(e.Error, &body) != nil || string(body.Param) != `"max_tokens"` || string(body.Code) != "400" {
				t.Errorf("%+v", body)
			}
		}},
		{"fastapi-detail.json", func() any { return new(ErrorResponse) }, func(t *testing.T, v any) {
			if e := v.(*ErrorResponse); e.Detail.Kind() != '[' {
				t.Errorf("%+v", e)
			}
		}},
		{"vllm-stream-logprobs.sse", func() any { return new(ErrorResponse) }, func(t *testing.T, v any) {
			var body ErrorBody
			if e := v.(*ErrorResponse); Decode(e.Error, &body) != nil || string(body.Param) != `"logprobs"` {
				t.Errorf("%+v", body)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			all := payloads(t, tc.file)
			if len(all) == 0 {
				t.Fatal("no payload")
			}
			for _, p := range all {
				v := tc.new()
				if err := DecodeLast(p, v); err != nil {
					t.Fatalf("%s: %v", p, err)
				}
				again, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				var got, want any
				if err := json.Unmarshal(again, &got); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(p, &want); err != nil {
					t.Fatal(err)
				}
				if d := within(got, want, "$"); d != "" {
					t.Errorf("%s\nre-encoded as %s\n%s", p, again, d)
				}
				// Encoding compacts the members kept as written: the second encoding is the first.
				w := tc.new()
				if err := DecodeLast(again, w); err != nil {
					t.Fatal(err)
				}
				if twice, err := json.Marshal(w); err != nil || !bytes.Equal(twice, again) {
					t.Errorf("decoding %s again gave %s (%v)", again, twice, err)
				}
				if tc.check != nil {
					tc.check(t, v)
				}
			}
		})
	}
}

// TestParseChunkReadsAsDecode: the choices and usage ParseChunk reads in its pass over a chunk are
// what decoding the chunk reads.
func TestParseChunkReadsAsDecode(t *testing.T) {
	for _, file := range []string{"vllm-chat-stream.sse", "sglang-chat-stream.sse", "vllm-text-stream.sse", "sglang-text-stream.sse"} {
		for _, p := range payloads(t, file) {
			var parsed, decoded ChatCompletionChunk
			if _, err := ParseChunk(nil, p, &parsed); err != nil {
				t.Fatal(err)
			}
			if err := DecodeLast(p, &decoded); err != nil {
				t.Fatal(err)
			}
			if len(parsed.Choices) == 0 && len(decoded.Choices) == 0 {
				parsed.Choices, decoded.Choices = nil, nil
			}
			if !reflect.DeepEqual(parsed, decoded) {
				t.Errorf("%s: ParseChunk read %+v, Decode %+v", p, parsed, decoded)
			}
		}
	}
	// A member written twice inside a choice: the last counts, nothing of the first remains.
	var c ChatCompletionChunk
	if _, err := ParseChunk(nil, []byte(`{"choices":[{"index":0,"delta":{"content":"x"},"delta":{"role":"assistant"},"finish_reason":"length","finish_reason":"stop"}]}`), &c); err != nil {
		t.Fatal(err)
	}
	if c.Choices[0].Delta.Generated() || c.Choices[0].FinishReason != "stop" {
		t.Errorf("%+v", c.Choices[0])
	}
	var v jsontext.Value
	if err := Decode([]byte(`{"a":{"b":1,"b":2}}`), &v); !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("Decode of a nested duplicate: %v", err)
	}
}

// TestRequestReadsAsDecode: the members Read takes from ParseRequest's fields, and the messages
// ReadMessages reads in one pass, are what decoding the body reads.
func TestRequestReadsAsDecode(t *testing.T) {
	bodies := append(payloads(t, "chat-request.json"),
		[]byte(`{"m\u006fdel":"a","messages":[{"r\u006fle":"user","content":"hi","extra":{"role":1}},{},{"content":null}],"stream":false}`),
		[]byte(`{"messages":[{"role":"user"},5,{"role":"tool"}]}`),
		[]byte(`{"messages":[]}`),
	)
	for _, raw := range bodies {
		fields, err := ParseRequest(nil, raw)
		if err != nil {
			t.Fatal(err)
		}
		var read, decoded ChatCompletionRequest
		read.Read(raw, fields)
		if err := Decode(raw, &decoded); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(read, decoded) {
			t.Errorf("%s: Read %+v, Decode %+v", raw, read, decoded)
		}
		var elems []jsontext.Value
		if err := Decode(decoded.Messages, &elems); err != nil {
			t.Fatal(err)
		}
		msgs, notObject, err := ReadMessages(nil, read.Messages)
		if err != nil {
			t.Fatal(err)
		}
		for i, elem := range elems {
			if elem.Kind() != '{' {
				if len(msgs) != i || notObject != elem.Kind() {
					t.Errorf("%s: %d messages read, then kind %v; element %d is %s", raw, len(msgs), notObject, i, elem)
				}
				break
			}
			var want ChatCompletionMessage
			if err := Decode(elem, &want); err != nil {
				t.Fatal(err)
			}
			if i >= len(msgs) || !reflect.DeepEqual(msgs[i], want) {
				t.Errorf("%s: message %d read as %+v, decoded as %+v", raw, i, msgs, want)
			}
		}
	}
}

// TestStringReadsAsDecode: String's shortcut for plain text gives what decoding gives.
func TestStringReadsAsDecode(t *testing.T) {
	for _, v := range []string{`"qwen3-32b"`, `""`, `"a\"b"`, `"caf\u00e9"`, `"café"`, "\"tab\there\"", `"\ud800"`, `"a"b"`, `"`, `5`, `null`, "\"\xff\""} {
		var want string
		wantOK := jsontext.Value(v).Kind() == '"' && Decode([]byte(v), &want) == nil
		got, ok := String(jsontext.Value(v))
		if ok != wantOK || got != want {
			t.Errorf("String(%s) = %q, %v; Decode gives %q, %v", v, got, ok, want, wantOK)
		}
	}
}

// TestParseCompletionReadsAsDecode: the choices and usage ParseCompletion reads in its pass over
// an answer are what decoding the answer by reflection reads.
func TestParseCompletionReadsAsDecode(t *testing.T) {
	answers := append(payloads(t, "vllm-chat-completion.json"), payloads(t, "sglang-chat-completion.json")...)
	answers = append(answers, payloads(t, "vllm-text-completion.json")...)
	answers = append(answers, [][]byte{
		[]byte(`{"choices":[{"finish_reason":null},{"finish_reason":"length"}],"usage":null}`),
		[]byte(`{"choices":[{"finish_reason":"length","finish_reason":"stop"}]}`),
		[]byte(`{"choices":[{},{"message":{"finish_reason":"x"}}]}`),
	}...)
	for _, p := range answers {
		var parsed ChatCompletion
		if _, err := ParseCompletion(nil, p, &parsed); err != nil {
			t.Fatal(err)
		}
		var decoded struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage jsontext.Value `json:"usage,omitzero"`
		}
		if err := json.Unmarshal(p, &decoded, jsontext.AllowDuplicateNames(true)); err != nil {
			t.Fatal(err)
		}
		ok := len(parsed.Choices) == len(decoded.Choices) && bytes.Equal(parsed.Usage, decoded.Usage)
		for i := 0; ok && i < len(parsed.Choices); i++ {
			ok = parsed.Choices[i].FinishReason == decoded.Choices[i].FinishReason
		}
		if !ok {
			t.Errorf("%s: ParseCompletion read %+v, Decode %+v", p, parsed, decoded)
		}
	}
}
