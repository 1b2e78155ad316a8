package simulator

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// checkError asserts the server's error body: vLLM's nested
// {"error":{"message","type","param","code"}} or SGLang's flat
// {"object":"error","message","type","param","code"}, with code the status and param as given
// ("" for null).
func checkError(t *testing.T, sw Software, resp *http.Response, status int, typ, message, param string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status = %d, want %d", resp.StatusCode, status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	checkErrorObject(t, sw, readJSON(t, resp), status, typ, message, param)
}

func checkErrorObject(t *testing.T, sw Software, v map[string]any, status int, typ, message, param string) {
	t.Helper()
	e := v
	if sw == SGLang {
		if len(v) != 5 || v["object"] != "error" {
			t.Errorf("body = %v, want SGLang's flat error", v)
		}
	} else {
		inner, ok := v["error"].(map[string]any)
		if len(v) != 1 || !ok || len(inner) != 4 {
			t.Fatalf("body = %v, want vLLM's nested error", v)
		}
		e = inner
	}
	if e["type"] != typ || num(t, e["code"]) != status {
		t.Errorf("error = %v, want type %s code %d", e, typ, status)
	}
	p, ok := e["param"]
	if !ok || (param == "" && p != nil) || (param != "" && p != param) {
		t.Errorf("param = %v (present %v), want %q", p, ok, param)
	}
	if got, _ := e["message"].(string); !strings.Contains(got, message) {
		t.Errorf("message = %q, want it to contain %q", got, message)
	}
}

func TestErrors(t *testing.T) {
	for _, sw := range []Software{VLLM, SGLang} {
		t.Run(string(sw), func(t *testing.T) { testErrors(t, sw) })
	}
}

func testErrors(t *testing.T, sw Software) {
	_, srv := newTestServer(t, sw)
	tests := []struct {
		name    string
		method  string // POST when empty
		path    string
		body    string
		status  int
		typ     string
		message string
	}{
		{"invalid JSON", "", "/v1/chat/completions", `{"model":`, 400, "BadRequestError", "JSON decode error"},
		{"body not an object", "", "/v1/completions", `[1,2]`, 400, "BadRequestError", "valid dictionary"},
		{"missing model", "", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "BadRequestError", "model: Field required"},
		{"unknown model", "", "/v1/chat/completions", chatBody("gpt-5", "hi", ""), 404, "NotFoundError", "The model `gpt-5` does not exist."},
		{"unknown model on completions", "", "/v1/completions", completionBody("gpt-5", "hi", ""), 404, "NotFoundError", "The model `gpt-5` does not exist."},
		{"missing messages", "", "/v1/chat/completions", `{"model":"` + qwen + `"}`, 400, "BadRequestError", "messages: Field required"},
		{"messages not a list", "", "/v1/chat/completions", `{"model":"` + qwen + `","messages":"hi"}`, 400, "BadRequestError", "messages: Input should be a valid list"},
		{"content of the wrong type", "", "/v1/chat/completions", `{"model":"` + qwen + `","messages":[{"role":"user","content":5}]}`, 400, "BadRequestError", "messages[0].content"},
		{"missing prompt", "", "/v1/completions", `{"model":"` + qwen + `"}`, 400, "BadRequestError", "prompt: Field required"},
		{"empty prompt list", "", "/v1/completions", `{"model":"` + qwen + `","prompt":[]}`, 400, "BadRequestError", "prompt"},
		{"mixed prompt list", "", "/v1/completions", `{"model":"` + qwen + `","prompt":["a",1]}`, 400, "BadRequestError", "prompt: Input should be"},
		{"stream as a string", "", "/v1/chat/completions", chatBody(qwen, "hi", `"stream":"true"`), 400, "BadRequestError", "stream: Input should be a valid boolean"},
		{"stream as a number", "", "/v1/completions", completionBody(qwen, "hi", `"stream":1`), 400, "BadRequestError", "stream: Input should be a valid boolean"},
		{"stream_options without stream", "", "/v1/chat/completions", chatBody(qwen, "hi", `"stream_options":{"include_usage":true}`), 400, "BadRequestError", "Stream options can only be defined when `stream=True`."},
		{"stream_options with stream false", "", "/v1/completions", completionBody(qwen, "hi", `"stream":false,"stream_options":{"include_usage":true}`), 400, "BadRequestError", "Stream options"},
		{"n 0", "", "/v1/chat/completions", chatBody(qwen, "hi", `"n":0`), 400, "BadRequestError", "n must be from 1 to 128, got 0."},
		{"too many choices", "", "/v1/completions", completionBody(qwen, "hi", `"n":129`), 400, "BadRequestError", "n must be from 1 to 128"},
		{"reasoning on completions", "", "/v1/completions", completionBody(qwen, "[[sim:reasoning=2]]", ""), 400, "BadRequestError", "only valid on /v1/chat/completions"},
		{"max_tokens 0", "", "/v1/chat/completions", chatBody(qwen, "hi", `"max_tokens":0`), 400, "BadRequestError", "max_tokens must be at least 1, got 0."},
		{"max_tokens not an integer", "", "/v1/completions", completionBody(qwen, "hi", `"max_tokens":"ten"`), 400, "BadRequestError", "max_tokens: Input should be a valid integer"},
		{"unknown directive", "", "/v1/chat/completions", chatBody(qwen, "[[sim:speed=3]]", ""), 400, "BadRequestError", `Unknown simulator directive "speed"`},
		{"bad directive value", "", "/v1/chat/completions", chatBody(qwen, "[[sim:tokens=-1]]", ""), 400, "BadRequestError", "[[sim:tokens=-1]]"},
		{"malformed directive", "", "/v1/completions", completionBody(qwen, "[[sim:tokens 3]]", ""), 400, "BadRequestError", "Malformed simulator directive"},
		{"status outside 400-599", "", "/v1/chat/completions", chatBody(qwen, "[[sim:status=200]]", ""), 400, "BadRequestError", "status"},
		{"tool_call on completions", "", "/v1/completions", completionBody(qwen, "[[sim:tool_call=f]]", ""), 400, "BadRequestError", "only valid on /v1/chat/completions"},
		{"unknown path", "", "/v1/embeddings", `{}`, 404, "NotFoundError", "Not Found"},
		{"unknown GET path", http.MethodGet, "/", "", 404, "NotFoundError", "Not Found"},
		{"GET on an inference endpoint", http.MethodGet, "/v1/chat/completions", "", 405, "MethodNotAllowedError", "Method Not Allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req, err := http.NewRequest(method, srv.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkError(t, sw, resp, tc.status, tc.typ, tc.message, "")
		})
	}
}

// TestContextLength checks each server's context-length rules on qwen's 100-token context:
// vLLM refuses a prompt over the context and a max_tokens that does not fit, before any stream
// starts, and lowers a missing max_tokens to fit; SGLang refuses a prompt of the context's
// length and a max_tokens that reaches it, inside the stream when streaming.
func TestContextLength(t *testing.T) {
	words := strings.Repeat("w ", 90)
	tests := []struct {
		name    string
		sw      Software
		path    string
		body    string
		status  int // 200: served; for SGLang streams, the status in the error event
		message string
		param   string
		stream  bool // SGLang: the error arrives in a 200 stream
	}{
		{name: "max_tokens too large", sw: VLLM, path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":20`), status: 400, param: "max_tokens",
			message: "'max_tokens' or 'max_completion_tokens' is too large: 20. This model's maximum context length is 100 tokens and your request has 90 input tokens (20 > 100 - 90)."},
		{name: "max_tokens too large, streaming", sw: VLLM, path: "/v1/completions", body: completionBody(qwen, words, `"max_tokens":11,"stream":true`), status: 400, param: "max_tokens",
			message: "'max_tokens' or 'max_completion_tokens' is too large: 11."},
		{name: "prompt alone too long", sw: VLLM, path: "/v1/completions", body: completionBody(qwen, strings.Repeat("w ", 120), ""), status: 400,
			message: "Input length (120) exceeds model's maximum context length (100)."},
		{name: "missing max_tokens is lowered to fit", sw: VLLM, path: "/v1/chat/completions", body: chatBody(qwen, words, ""), status: 200},
		{name: "exactly the context", sw: VLLM, path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":10`), status: 200},
		{name: "directives count as words", sw: VLLM, path: "/v1/chat/completions", body: chatBody(qwen, words+"[[sim:tokens=1]]", `"max_tokens":10`), status: 400, param: "max_tokens", message: "your request has 91 input tokens (10 > 100 - 91)"},
		{name: "each prompt of an array", sw: VLLM, path: "/v1/completions", body: `{"model":"` + qwen + `","prompt":["a", "` + words + `"],"max_tokens":11}`, status: 400, param: "max_tokens", message: "your request has 90 input tokens"},
		{name: "sglang: total reaches the context", sw: SGLang, path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":10`), status: 400,
			message: "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a total of 100 tokens: 90 tokens from the input messages and 10 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."},
		{name: "sglang: prompt of the context's length", sw: SGLang, path: "/v1/completions", body: completionBody(qwen, strings.Repeat("w ", 100), ""), status: 400,
			message: "The input (100 tokens) is longer than the model's context length (100 tokens)."},
		{name: "sglang: in the stream", sw: SGLang, path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":10,"stream":true`), status: 400, stream: true,
			message: "Requested token count exceeds the model's maximum context length of 100 tokens."},
		{name: "sglang: fits", sw: SGLang, path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":9`), status: 200},
	}
	servers := map[Software]*httptest.Server{}
	for _, sw := range []Software{VLLM, SGLang} {
		_, servers[sw] = newTestServer(t, sw)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, servers[tc.sw], tc.path, tc.body)
			switch {
			case tc.status == http.StatusOK:
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status = %d", resp.StatusCode)
				}
			case tc.stream:
				s := readStream(t, resp)
				if resp.StatusCode != http.StatusOK || !s.done || len(s.chunks) != 1 {
					t.Fatalf("status %d, stream %s (done %v), want one error event and [DONE]", resp.StatusCode, s.raw, s.done)
				}
				checkStreamError(t, tc.sw, s.chunks[0], tc.status, "BadRequestError", tc.message, tc.param)
			default:
				checkError(t, tc.sw, resp, tc.status, "BadRequestError", tc.message, tc.param)
			}
		})
	}
}

// checkPlain asserts a text/plain error with exactly body.
func checkPlain(t *testing.T, resp *http.Response, status int, body string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status = %d, want %d", resp.StatusCode, status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type = %q, want text/plain", ct)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != body {
		t.Errorf("body = %q, want %q", got, body)
	}
}

func TestRequiredToolChoice(t *testing.T) {
	_, srv := newTestServer(t)
	tools := `"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{}}}]`
	tests := []struct {
		name   string
		body   string
		reject bool
	}{
		{"required on qwen3-32b", chatBody(qwen, "hi", tools+`,"tool_choice":"required"`), true},
		{"required on qwen3-32b, streaming", chatBody(qwen, "hi", tools+`,"tool_choice":"required","stream":true`), true},
		{"auto on qwen3-32b", chatBody(qwen, "hi", tools+`,"tool_choice":"auto"`), false},
		{"named function on qwen3-32b", chatBody(qwen, "hi", tools+`,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`), false},
		{"required on gpt-oss-120b", chatBody(gptOSS, "hi", tools+`,"tool_choice":"required"`), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv, "/v1/chat/completions", tc.body)
			if tc.reject {
				checkPlain(t, resp, http.StatusInternalServerError, "Internal Server Error")
				return
			}
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status = %d, want 200", resp.StatusCode)
			}
		})
	}
}

func TestStatusDirective(t *testing.T) {
	for _, sw := range []Software{VLLM, SGLang} {
		t.Run(string(sw), func(t *testing.T) { testStatusDirective(t, sw) })
	}
}

func testStatusDirective(t *testing.T, sw Software) {
	_, srv := newTestServer(t, sw)
	tests := []struct {
		status int
		stream bool
		plain  string // text/plain body; "" for a JSON error
		typ    string
	}{
		{status: 500, plain: "Internal Server Error"},
		{status: 500, stream: true, plain: "Internal Server Error"},
		{status: 502, plain: "Bad Gateway"},
		{status: 503, stream: true, plain: "Service Unavailable"},
		{status: 400, typ: "BadRequestError"},
		{status: 404, typ: "NotFoundError"},
		{status: 413, typ: "RequestEntityTooLargeError"},
		{status: 429, stream: true, typ: "TooManyRequestsError"},
		{status: 501, typ: "NotImplementedError"},
		{status: 501, stream: true, typ: "NotImplementedError"},
	}
	for _, tc := range tests {
		name := http.StatusText(tc.status)
		if tc.stream {
			name += " streaming"
		}
		t.Run(name, func(t *testing.T) {
			directive := "[[sim:status=" + strconv.Itoa(tc.status) + "]]"
			extra := ""
			if tc.stream {
				extra = `"stream":true`
			}
			resp := post(t, srv, "/v1/chat/completions", chatBody(qwen, "hi "+directive, extra))
			if tc.plain != "" {
				checkPlain(t, resp, tc.status, tc.plain)
				return
			}
			checkError(t, sw, resp, tc.status, tc.typ, "Simulated", "")
		})
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, srv := newTestServer(t)
	resp, err := srv.Client().Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	v := readJSON(t, resp)
	if v["object"] != "list" {
		t.Errorf("object = %v", v["object"])
	}
	data := v["data"].([]any)
	if len(data) != 2 {
		t.Fatalf("data = %v", data)
	}
	for i, want := range []struct {
		id  string
		ctx int
	}{{qwen, 100}, {gptOSS, 131072}} {
		m := data[i].(map[string]any)
		if m["id"] != want.id || m["object"] != "model" || m["owned_by"] != "vllm" || num(t, m["max_model_len"]) != want.ctx || num(t, m["created"]) != int(testNow.Unix()) {
			t.Errorf("data[%d] = %v", i, m)
		}
	}

	health, err := srv.Client().Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != http.StatusOK {
		t.Errorf("/health status = %d", health.StatusCode)
	}
}

// TestTypeErrorField checks that a value of the wrong type is named by its path in the body, as
// vLLM names it, whichever Go struct holds the field.
func TestTypeErrorField(t *testing.T) {
	_, srv := newTestServer(t)
	tests := []struct{ path, body, message string }{
		{"/v1/chat/completions", `{"model":5,"messages":[]}`, "model: Input should be a valid string"},
		{"/v1/completions", completionBody(qwen, "hi", `"n":"two"`), "n: Input should be a valid integer"},
		{"/v1/chat/completions", chatBody(qwen, "hi", `"stream":true,"stream_options":{"include_usage":1}`), "stream_options.include_usage: Input should be a valid boolean"},
		{"/v1/chat/completions", `{"model":"` + qwen + `","messages":"hi"}`, "messages: Input should be a valid list"},
	}
	for _, tc := range tests {
		resp, err := srv.Client().Post(srv.URL+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Message string } `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || body.Error.Message != tc.message {
			t.Errorf("%s: message %q (%v), want %q", tc.body, body.Error.Message, err, tc.message)
		}
	}
}
