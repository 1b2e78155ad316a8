package simulator

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// checkVLLMError asserts vLLM's error body: {"object":"error","message","type","param":null,"code"}.
func checkVLLMError(t *testing.T, resp *http.Response, status int, typ, message string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status = %d, want %d", resp.StatusCode, status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	v := readJSON(t, resp)
	if len(v) != 5 || v["object"] != "error" || v["type"] != typ || num(t, v["code"]) != status {
		t.Errorf("body = %v, want a vLLM %s error with code %d", v, typ, status)
	}
	if p, ok := v["param"]; !ok || p != nil {
		t.Errorf("param = %v (present %v), want null", p, ok)
	}
	if got, _ := v["message"].(string); !strings.Contains(got, message) {
		t.Errorf("message = %q, want it to contain %q", got, message)
	}
}

func TestErrors(t *testing.T) {
	_, srv := newTestServer(t)
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
		{"n above 1", "", "/v1/chat/completions", chatBody(qwen, "hi", `"n":2`), 400, "BadRequestError", "n must be 1"},
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
			checkVLLMError(t, resp, tc.status, tc.typ, tc.message)
		})
	}
}

func TestContextLength(t *testing.T) {
	_, srv := newTestServer(t) // qwen: 100 tokens
	words := strings.Repeat("w ", 90)
	tests := []struct {
		name    string
		path    string
		body    string
		status  int
		message string
	}{
		{
			name: "chat", path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":20`), status: 400,
			message: "This model's maximum context length is 100 tokens. However, you requested 110 tokens (90 in the messages, 20 in the completion). Please reduce the length of the messages or completion.",
		},
		{
			name: "completions", path: "/v1/completions", body: completionBody(qwen, words, `"max_tokens":11`), status: 400,
			message: "This model's maximum context length is 100 tokens. However, you requested 101 tokens (90 in the prompt, 11 in the completion). Please reduce the length of the prompt or completion.",
		},
		{
			name: "prompt alone too long", path: "/v1/completions", body: completionBody(qwen, strings.Repeat("w ", 120), `"max_tokens":1`), status: 400,
			message: "This model's maximum context length is 100 tokens. However, you requested 121 tokens (120 in the prompt, 1 in the completion).",
		},
		{
			name: "default max_tokens counts", path: "/v1/chat/completions", body: chatBody(qwen, words, ""), status: 400,
			message: "(90 in the messages, 16 in the completion)",
		},
		{name: "exactly the context", path: "/v1/chat/completions", body: chatBody(qwen, words, `"max_tokens":10`), status: 200},
		{name: "directives count as words", path: "/v1/chat/completions", body: chatBody(qwen, words+"[[sim:tokens=1]]", `"max_tokens":10`), status: 400, message: "(91 in the messages, 10 in the completion)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv, tc.path, tc.body)
			if tc.status == http.StatusOK {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status = %d", resp.StatusCode)
				}
				return
			}
			checkVLLMError(t, resp, tc.status, "BadRequestError", tc.message)
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
	_, srv := newTestServer(t)
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
			checkVLLMError(t, resp, tc.status, tc.typ, "Simulated")
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
