package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestEndpointChecks covers every error of contract sections 3 and 4 that the gateway raises
// itself, with exact status, type, param and code, and the seed pages' messages word for word.
// None of these requests may reach a backend, and each is recorded as rejected.
func TestEndpointChecks(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const (
		chat      = "/v1/chat/completions"
		compl     = "/v1/completions"
		seedEmpty = "Invalid 'messages': the array must contain at least one message."
	)
	user := `"messages":[{"role":"user","content":"hi"}]`
	tool := func(fn string) string {
		return `{"model":"gpt-oss-120b",` + user + `,"tools":[{"type":"function","function":` + fn + `}]}`
	}
	tests := []struct {
		name     string
		path     string
		body     string
		status   int
		param    string // "" means null
		code     string // "" means null
		message  string // checked when set
		contains string // checked when set
	}{
		// JSON.
		{name: "malformed JSON", path: chat, body: `{"model":"qwen3-32b",`, status: 400},
		{name: "empty body", path: chat, body: ``, status: 400},
		{name: "whitespace body", path: chat, body: "  \n", status: 400},
		{name: "top-level array", path: chat, body: `[{"model":"qwen3-32b"}]`, status: 400, contains: "object"},
		{name: "top-level string", path: compl, body: `"hello"`, status: 400, contains: "object"},
		{name: "trailing garbage", path: chat, body: `{"model":"qwen3-32b",` + user + `} x`, status: 400},
		{name: "duplicate keys", path: chat, body: `{"model":"qwen3-32b","model":"gpt-oss-120b",` + user + `}`, status: 400, contains: "model"},
		{name: "duplicate keys on completions", path: compl, body: `{"model":"qwen3-32b","prompt":"a","prompt":"b"}`, status: 400, contains: "prompt"},
		// Duplicates nested at any depth: the same part without the duplicate is refused (image on a
		// text-only model), so a duplicate must not be a way past that check.
		{name: "duplicate type in a content part", path: chat,
			body:   `{"model":"qwen3-32b","messages":[{"role":"user","content":[{"type":"image_url","type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`,
			status: 400, contains: `duplicate key "type"`},
		{name: "duplicate role", path: chat, body: `{"model":"qwen3-32b","messages":[{"role":"user","role":"system","content":"hi"}]}`, status: 400, contains: `duplicate key "role"`},
		{name: "duplicate role spelled differently", path: chat, body: `{"model":"qwen3-32b","messages":[{"role":"user","r\u006fle":"system","content":"hi"}]}`, status: 400, contains: `duplicate key "role"`},
		{name: "duplicate in a function's parameters", path: chat,
			body:   tool(`{"name":"w","description":"W.","parameters":{"type":"object","properties":{"a":{"type":"string","type":"number"}}}}`),
			status: 400, contains: `duplicate key "type"`},
		{name: "duplicate in stream_options", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":true,"stream_options":{"include_usage":false,"include_usage":true}}`, status: 400, contains: `duplicate key "include_usage"`},
		{name: "duplicate in an unknown member", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","extra_body":{"x":[{"k":1,"k":2}]}}`, status: 400, contains: `duplicate key "k"`},
		// model.
		{name: "model missing", path: chat, body: `{` + user + `}`, status: 400, param: "model", code: "missing_required_parameter"},
		{name: "model missing on completions", path: compl, body: `{"prompt":"hi"}`, status: 400, param: "model", code: "missing_required_parameter"},
		{name: "model a number", path: chat, body: `{"model":5,` + user + `}`, status: 400, param: "model", code: "invalid_type"},
		{name: "model null", path: chat, body: `{"model":null,` + user + `}`, status: 400, param: "model", code: "invalid_type"},
		{name: "model an array", path: compl, body: `{"model":["qwen3-32b"],"prompt":"hi"}`, status: 400, param: "model", code: "invalid_type"},
		{name: "unknown model", path: chat, body: `{"model":"not-a-model",` + user + `}`, status: 404, param: "model", code: "model_not_found",
			message: "The model `not-a-model` does not exist or you do not have access to it."},
		{name: "unknown model on completions", path: compl, body: `{"model":"not-a-model","prompt":"hi"}`, status: 404, param: "model", code: "model_not_found",
			message: "The model `not-a-model` does not exist or you do not have access to it."},
		{name: "model id of 257 bytes", path: chat, body: `{"model":"` + strings.Repeat("m", 257) + `",` + user + `}`, status: 404, param: "model", code: "model_not_found",
			message: "The model `" + strings.Repeat("m", 64) + "…` does not exist or you do not have access to it."},
		{name: "model id of 450 KB", path: compl, body: `{"model":"` + strings.Repeat("é", 225000) + `","prompt":"hi"}`, status: 404, param: "model", code: "model_not_found",
			message: "The model `" + strings.Repeat("é", 32) + "…` does not exist or you do not have access to it."},
		{name: "backend name is not a public id", path: compl, body: `{"model":"Qwen/Qwen3-32B","prompt":"hi"}`, status: 404, param: "model", code: "model_not_found",
			message: "The model `Qwen/Qwen3-32B` does not exist or you do not have access to it."},
		// messages.
		{name: "messages missing", path: chat, body: `{"model":"qwen3-32b"}`, status: 400, param: "messages", code: "empty_array", message: seedEmpty},
		{name: "messages empty", path: chat, body: `{"model":"qwen3-32b","messages":[]}`, status: 400, param: "messages", code: "empty_array", message: seedEmpty},
		{name: "messages null", path: chat, body: `{"model":"qwen3-32b","messages":null}`, status: 400, param: "messages", code: "empty_array", message: seedEmpty},
		{name: "messages a string", path: chat, body: `{"model":"qwen3-32b","messages":"hi"}`, status: 400, param: "messages", code: "empty_array", message: seedEmpty},
		{name: "messages an object", path: chat, body: `{"model":"qwen3-32b","messages":{"role":"user"}}`, status: 400, param: "messages", code: "empty_array", message: seedEmpty},
		{name: "message not an object", path: chat, body: `{"model":"qwen3-32b","messages":["hi"]}`, status: 400, param: "messages[0]", code: "invalid_type"},
		{name: "role missing", path: chat, body: `{"model":"qwen3-32b","messages":[{"content":"hi"}]}`, status: 400, param: "messages[0].role", code: "missing_required_parameter"},
		{name: "bad role", path: chat, body: `{"model":"qwen3-32b","messages":[{"role":"user","content":"a"},{"role":"wizard","content":"hi"}]}`, status: 400, param: "messages[1].role", code: "invalid_value"},
		{name: "role not a string", path: chat, body: `{"model":"qwen3-32b","messages":[{"role":1,"content":"hi"}]}`, status: 400, param: "messages[0].role", code: "invalid_value"},
		{name: "tool message without tool_call_id", path: chat,
			body:   `{"model":"qwen3-32b","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","content":"sunny"}]}`,
			status: 400, param: "messages[2].tool_call_id", code: "missing_required_parameter"},
		{name: "tool_call_id not a string", path: chat,
			body:   `{"model":"qwen3-32b","messages":[{"role":"user","content":"weather?"},{"role":"tool","tool_call_id":7,"content":"sunny"}]}`,
			status: 400, param: "messages[1].tool_call_id", code: "invalid_type"},
		{name: "image on a text-only model", path: chat,
			body:   `{"model":"qwen3-32b","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
			status: 400, param: "messages[0].content[1]", code: "unsupported_value"},
		{name: "image on gpt-oss", path: chat,
			body:   `{"model":"gpt-oss-120b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`,
			status: 400, param: "messages[0].content[0]", code: "unsupported_value"},
		// tools.
		{name: "function without description", path: chat, body: tool(`{"name":"get_weather","parameters":{"type":"object"}}`), status: 400, param: "tools[0].function.description"},
		{name: "function with empty description", path: chat, body: tool(`{"name":"get_weather","description":""}`), status: 400, param: "tools[0].function.description"},
		{name: "function description not a string", path: chat, body: tool(`{"name":"get_weather","description":5}`), status: 400, param: "tools[0].function.description"},
		{name: "second function without description", path: chat,
			body:   `{"model":"gpt-oss-120b",` + user + `,"tools":[{"type":"function","function":{"name":"a","description":"A."}},{"type":"function","function":{"name":"b"}}]}`,
			status: 400, param: "tools[1].function.description"},
		{name: "function without name", path: chat, body: tool(`{"description":"Weather."}`), status: 400, param: "tools[0].function.name", code: "missing_required_parameter"},
		{name: "tools not an array", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"tools":{}}`, status: 400, param: "tools", code: "invalid_type"},
		// ignore_eos.
		{name: "ignore_eos on gpt-oss chat", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":true}`, status: 400, param: "ignore_eos", code: "unsupported_parameter"},
		{name: `ignore_eos "true" on gpt-oss chat`, path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":"true"}`, status: 400, param: "ignore_eos", code: "unsupported_parameter"},
		{name: "ignore_eos 1 on gpt-oss chat", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":1}`, status: 400, param: "ignore_eos", code: "unsupported_parameter"},
		// Forms vLLM's pydantic also reads as true; the gateway does not read them, so refuses them.
		{name: `ignore_eos "yes" on gpt-oss chat`, path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":"yes"}`, status: 400, param: "ignore_eos", code: "invalid_type"},
		{name: "ignore_eos 1.0 on gpt-oss chat", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":1.0}`, status: 400, param: "ignore_eos", code: "invalid_type"},
		{name: `ignore_eos "True" on gpt-oss chat`, path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":"True"}`, status: 400, param: "ignore_eos", code: "invalid_type"},
		{name: `ignore_eos "\u0074rue" on gpt-oss chat`, path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"ignore_eos":"\u0074rue"}`, status: 400, param: "ignore_eos", code: "invalid_type"},
		// tool_choice.
		{name: "tool_choice required on qwen3-32b", path: chat,
			body:   `{"model":"qwen3-32b",` + user + `,"tools":[{"type":"function","function":{"name":"w","description":"Weather."}}],"tool_choice":"required"}`,
			status: 400, param: "tool_choice", code: "unsupported_parameter"},
		{name: "named tool_choice on qwen3-32b", path: chat,
			body:   `{"model":"qwen3-32b",` + user + `,"tools":[{"type":"function","function":{"name":"w","description":"Weather."}}],"tool_choice":{"type":"function","function":{"name":"w"}}}`,
			status: 400, param: "tool_choice", code: "unsupported_parameter"},
		// reasoning_effort.
		{name: "reasoning_effort extreme", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"reasoning_effort":"extreme"}`, status: 400, param: "reasoning_effort", code: "invalid_value"},
		{name: "reasoning_effort upper case", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"reasoning_effort":"HIGH"}`, status: 400, param: "reasoning_effort", code: "invalid_value"},
		{name: "reasoning_effort a number", path: chat, body: `{"model":"gpt-oss-120b",` + user + `,"reasoning_effort":1}`, status: 400, param: "reasoning_effort", code: "invalid_value"},
		// stream and stream_options.
		{name: "stream yes", path: chat, body: `{"model":"qwen3-32b",` + user + `,"stream":"yes"}`, status: 400, param: "stream", code: "invalid_type"},
		{name: "stream 2", path: chat, body: `{"model":"qwen3-32b",` + user + `,"stream":2}`, status: 400, param: "stream", code: "invalid_type"},
		{name: "stream object", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":{}}`, status: 400, param: "stream", code: "invalid_type"},
		{name: "stream True", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":"True"}`, status: 400, param: "stream", code: "invalid_type"},
		{name: "stream 1.0", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":1.0}`, status: 400, param: "stream", code: "invalid_type"},
		{name: "stream_options without stream", path: chat, body: `{"model":"qwen3-32b",` + user + `,"stream_options":{"include_usage":true}}`, status: 400, param: "stream_options", code: "invalid_value"},
		{name: "stream_options with stream false", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":false,"stream_options":{"include_usage":true}}`, status: 400, param: "stream_options", code: "invalid_value"},
		{name: "stream_options not an object", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":true,"stream_options":true}`, status: 400, param: "stream_options", code: "invalid_type"},
		{name: "include_usage not a boolean", path: compl, body: `{"model":"qwen3-32b","prompt":"hi","stream":true,"stream_options":{"include_usage":"yes"}}`, status: 400, param: "stream_options.include_usage", code: "invalid_type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := h.rec.count()
			r := h.do(req{path: tc.path, body: tc.body, key: h.key})
			if r.status != tc.status {
				t.Fatalf("status = %d, want %d; body %s", r.status, tc.status, r.body)
			}
			e := r.errorBody(t)
			if e.Type != "invalid_request_error" {
				t.Errorf("type = %s", e.Type)
			}
			if got := deref(e.Param); (tc.param == "" && e.Param != nil) || (tc.param != "" && got != tc.param) {
				t.Errorf("param = %s, want %q", got, tc.param)
			}
			if got := deref(e.Code); (tc.code == "" && e.Code != nil) || (tc.code != "" && got != tc.code) {
				t.Errorf("code = %s, want %q", got, tc.code)
			}
			if tc.message != "" && e.Message != tc.message {
				t.Errorf("message = %q, want %q", e.Message, tc.message)
			}
			if tc.contains != "" && !strings.Contains(e.Message, tc.contains) {
				t.Errorf("message %q does not mention %q", e.Message, tc.contains)
			}
			if !genIDPattern.MatchString(r.genID()) {
				t.Errorf("generation id %q", r.genID())
			}
			if h.rec.count() != before {
				t.Errorf("the request reached the backend")
			}
			ev := h.waitEvent(h.orgID, r.genID())
			if ev.Status != "rejected" || ev.HTTPStatus != tc.status || ev.Cost != 0 || ev.Endpoint != tc.path {
				t.Errorf("event: status %s, http %d, cost %s, endpoint %s", ev.Status, ev.HTTPStatus, ev.Cost, ev.Endpoint)
			}
		})
	}
}

// TestAcceptedParameters checks what must pass the gateway's checks and reach the backend:
// what the seed pages say is forwarded, and the lenient stream values.
func TestAcceptedParameters(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const (
		chat  = "/v1/chat/completions"
		compl = "/v1/completions"
	)
	tests := []struct {
		name   string
		path   string
		body   string
		stream bool
		// forwarded, when set, is a member the backend must receive exactly as written.
		forwarded string
	}{
		{name: "ignore_eos on completions, gpt-oss", path: compl, body: `{"model":"gpt-oss-120b","prompt":"M1 [[sim:tokens=1]]","ignore_eos":true}`, forwarded: `"ignore_eos":true`},
		{name: "ignore_eos on chat, qwen3-32b", path: chat, body: chatBody("qwen3-32b", "M2 [[sim:tokens=1]]", `"ignore_eos":true`), forwarded: `"ignore_eos":true`},
		{name: "ignore_eos false on gpt-oss chat", path: chat, body: chatBody("gpt-oss-120b", "M3 [[sim:tokens=1]]", `"ignore_eos":false`), forwarded: `"ignore_eos":false`},
		{name: `ignore_eos "false" on gpt-oss chat`, path: chat, body: chatBody("gpt-oss-120b", "M14 [[sim:tokens=1]]", `"ignore_eos":"false"`), forwarded: `"ignore_eos":"false"`},
		{name: "ignore_eos 0 on gpt-oss chat", path: chat, body: chatBody("gpt-oss-120b", "M15 [[sim:tokens=1]]", `"ignore_eos":0`), forwarded: `"ignore_eos":0`},
		{name: `ignore_eos "true" on chat, qwen3-32b`, path: chat, body: chatBody("qwen3-32b", "M16 [[sim:tokens=1]]", `"ignore_eos":"true"`), forwarded: `"ignore_eos":"true"`},
		{name: "tool_choice auto on qwen3-32b", path: chat,
			body:      chatBody("qwen3-32b", "M4 [[sim:tokens=1]]", `"tools":[{"type":"function","function":{"name":"w","description":"Weather."}}]`, `"tool_choice":"auto"`),
			forwarded: `"tool_choice":"auto"`},
		{name: "tool_choice none on qwen3-32b", path: chat, body: chatBody("qwen3-32b", "M5 [[sim:tokens=1]]", `"tool_choice":"none"`), forwarded: `"tool_choice":"none"`},
		{name: "tool_choice required on gpt-oss", path: chat,
			body:      chatBody("gpt-oss-120b", "M6 [[sim:tokens=1]]", `"tools":[{"type":"function","function":{"name":"w","description":"Weather."}}]`, `"tool_choice":"required"`),
			forwarded: `"tool_choice":"required"`},
		{name: "reasoning_effort low", path: chat, body: chatBody("gpt-oss-120b", "M7 [[sim:tokens=1]]", `"reasoning_effort":"low"`), forwarded: `"reasoning_effort":"low"`},
		{name: "reasoning_effort medium", path: chat, body: chatBody("gpt-oss-120b", "M8 [[sim:tokens=1]]", `"reasoning_effort":"medium"`), forwarded: `"reasoning_effort":"medium"`},
		{name: "reasoning_effort high", path: chat, body: chatBody("gpt-oss-120b", "M9 [[sim:tokens=1]]", `"reasoning_effort":"high"`), forwarded: `"reasoning_effort":"high"`},
		{name: "developer and tool roles", path: chat,
			body:      `{"model":"qwen3-32b","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"},{"role":"user","content":"M10 [[sim:tokens=1]]"}]}`,
			forwarded: `"tool_call_id":"call_1"`},
		{name: "text parts on a text model", path: chat,
			body:      `{"model":"qwen3-32b","messages":[{"role":"user","content":[{"type":"text","text":"M11 [[sim:tokens=1]]"}]}]}`,
			forwarded: `[{"type":"text","text":"M11 [[sim:tokens=1]]"}]`},
		{name: "prompt not validated", path: compl, body: `{"model":"qwen3-32b","prompt":["M12 [[sim:tokens=1]]"],"weird":[1,{"x":null}]}`, forwarded: `"weird":[1,{"x":null}]`},
		// stream values.
		{name: "stream true", path: chat, body: chatBody("qwen3-32b", "S1 [[sim:tokens=1]]", `"stream":true`), stream: true, forwarded: `"stream":true`},
		{name: `stream "true"`, path: chat, body: chatBody("qwen3-32b", "S2 [[sim:tokens=1]]", `"stream":"true"`), stream: true, forwarded: `"stream":true`},
		{name: "stream 1", path: compl, body: `{"model":"qwen3-32b","prompt":"S3 [[sim:tokens=1]]","stream":1}`, stream: true, forwarded: `"stream":true`},
		{name: "stream false", path: chat, body: chatBody("qwen3-32b", "S4 [[sim:tokens=1]]", `"stream":false`), forwarded: `"stream":false`},
		{name: `stream "false"`, path: chat, body: chatBody("qwen3-32b", "S5 [[sim:tokens=1]]", `"stream":"false"`), forwarded: `"stream":false`},
		{name: "stream 0", path: compl, body: `{"model":"qwen3-32b","prompt":"S6 [[sim:tokens=1]]","stream":0}`, forwarded: `"stream":false`},
		{name: "stream null", path: compl, body: `{"model":"qwen3-32b","prompt":"S7 [[sim:tokens=1]]","stream":null}`, forwarded: `"stream":false`},
		{name: "stream absent", path: compl, body: `{"model":"qwen3-32b","prompt":"S8 [[sim:tokens=1]]"}`},
		{name: "stream_options null without stream", path: compl, body: `{"model":"qwen3-32b","prompt":"S9 [[sim:tokens=1]]","stream_options":null}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(req{path: tc.path, body: tc.body, key: h.key})
			if r.status != 200 {
				t.Fatalf("status %d, body %s", r.status, r.body)
			}
			ct := r.header.Get("Content-Type")
			if tc.stream {
				if ct != "text/event-stream" || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
					t.Errorf("want a stream: Content-Type %q, body %s", ct, r.body)
				}
			} else {
				var v map[string]any
				if ct != "application/json" || json.Unmarshal(r.body, &v) != nil {
					t.Errorf("want JSON: Content-Type %q, body %s", ct, r.body)
				}
			}
			marker := tc.body[strings.Index(tc.body, "[[sim:")-3 : strings.Index(tc.body, "[[sim:")]
			fw, _ := h.rec.find(t, marker)
			if tc.forwarded != "" && !strings.Contains(string(fw.Body), tc.forwarded) {
				t.Errorf("forwarded body %s lacks %s", fw.Body, tc.forwarded)
			}
			if !tc.stream && strings.Contains(string(fw.Body), `"stream":true`) {
				t.Errorf("forwarded body %s streams", fw.Body)
			}
			if !tc.stream && strings.Contains(string(fw.Body), `stream_options`) && !strings.Contains(tc.body, "stream_options") {
				t.Errorf("forwarded body %s has stream_options", fw.Body)
			}
		})
	}
}

// TestMethodAndPath checks the router's errors.
func TestMethodAndPath(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	tests := []struct {
		method, path string
		status       int
		code         string
		allow        string
	}{
		{http.MethodGet, "/v1/chat/completions", 405, "method_not_allowed", "POST"},
		{http.MethodPut, "/v1/completions", 405, "method_not_allowed", "POST"},
		{http.MethodPost, "/v1/models", 405, "method_not_allowed", "GET, HEAD"},
		{http.MethodDelete, "/v1/credits", 405, "method_not_allowed", "GET, HEAD"},
		{http.MethodGet, "/v1/nothing", 404, "unknown_url", ""},
		{http.MethodPost, "/chat/completions", 404, "unknown_url", ""},
		{http.MethodGet, "/", 404, "unknown_url", ""},
		{http.MethodPost, "/v1/chat/completions/", 404, "unknown_url", ""},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := h.do(req{method: tc.method, path: tc.path, key: h.key})
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			e := r.errorBody(t)
			if deref(e.Code) != tc.code || e.Type != "invalid_request_error" {
				t.Errorf("type, code = %s, %s", e.Type, deref(e.Code))
			}
			if got := r.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
		})
	}
	if n := h.rec.count(); n != 0 {
		t.Errorf("%d requests reached the backend", n)
	}
}

// TestLongModelIDIsBounded sends model ids up to 450 KB: the answer, the usage event and what the
// store keeps of it quote at most 64 bytes of the id (contract section 4).
func TestLongModelIDIsBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, n := range []int{256, 257, 1100, 450000} {
		id := strings.Repeat("=", n)
		r := h.do(req{path: "/v1/chat/completions", body: `{"model":"` + id + `","messages":[{"role":"user","content":"hi"}]}`, key: h.key})
		if r.status != http.StatusNotFound || len(r.body) > 300 {
			t.Fatalf("%d bytes: %d, %d bytes of body", n, r.status, len(r.body))
		}
		ev := h.waitEvent(h.orgID, r.genID())
		want := id
		if n > 256 {
			want = strings.Repeat("=", 64) + "…"
		}
		if ev.Model != want {
			t.Errorf("%d bytes: the event records a model of %d bytes, want %d", n, len(ev.Model), len(want))
		}
	}
}
