package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/upstream"
)

// TestRefusalInsideStream checks issue 17's first point on both servers: a request the backend
// refuses only once its 200 stream has started (vLLM's engine checks logprobs there, SGLang the
// context) reaches the client as the stream's last event with the backend's message, param and a
// 400's type and null code; it is recorded as rejected, costs nothing when nothing was generated,
// and never counts against the backend: with a breaker that opens on one failure, the model
// still serves afterwards.
func TestRefusalInsideStream(t *testing.T) {
	t.Parallel()
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		h := newHarness(t, config{server: server, upstream: func(o *upstream.Options) { o.FailureThreshold = 1; o.OpenFor = time.Minute }})
		keyB, _ := h.newOrg("org_other", initialCredits, 8)
		type refusal struct {
			name, body       string
			message, param   string
			completionTokens int64 // generated before the refusal
		}
		cases := []refusal{{
			name: "generated nothing", body: chatBody("qwen3-32b", "R1 [[sim:stream_error=400]]", `"stream":true`),
			message: "Simulated error: Bad Request.",
		}, {
			name: "after two tokens", body: chatBody("qwen3-32b", "R2 [[sim:stream_error=422]] [[sim:tokens=2]]", `"stream":true`, `"stream_options":{"include_usage":true}`),
			message: "Simulated error: Unprocessable Entity.", completionTokens: 2,
		}}
		if server == catalog.ServerVLLM {
			cases = append(cases, refusal{
				name: "logprobs", body: chatBody("qwen3-32b", "R3", `"stream":true`, `"logprobs":true`, `"top_logprobs":25`),
				message: "Requested sample logprobs of 25, which is greater than max allowed: 20", param: "logprobs",
			})
		} else {
			cases = append(cases, refusal{
				name: "context", body: chatBody("qwen3-32b", "R3 two three", `"stream":true`, `"max_tokens":40958`),
				message: "Requested token count exceeds the model's maximum context length of 40960 tokens. You requested a total of 40961 tokens: 3 tokens from the input messages and 40958 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
			})
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := h.balance(h.orgID)
				s := h.stream(req{path: "/v1/chat/completions", body: tc.body, key: h.key})
				if s.resp.StatusCode != 200 {
					t.Fatalf("status %d", s.resp.StatusCode)
				}
				evs := dataEvents(s.all())
				if len(evs) == 0 {
					t.Fatal("no events")
				}
				content := 0
				for _, ev := range evs[:len(evs)-1] {
					if ev.data == "[DONE]" {
						t.Fatal("[DONE] before the error event")
					}
					if parseChunk(t, ev.data).hasContent() {
						content++
					}
				}
				if int64(content) != tc.completionTokens {
					t.Errorf("%d content chunks, want %d", content, tc.completionTokens)
				}
				last := evs[len(evs)-1].data
				var env struct {
					Error *apiErr `json:"error"`
				}
				dec := json.NewDecoder(strings.NewReader(last))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&env); err != nil || env.Error == nil {
					t.Fatalf("last event %s, want only an error: %v", last, err)
				}
				e := env.Error
				if e.Message != tc.message || e.Type != "invalid_request_error" || e.Code != nil || !paramIs(e.Param, tc.param) {
					t.Errorf("error %+v (param %s), want message %q, invalid_request_error, param %q, code null", *e, deref(e.Param), tc.message, tc.param)
				}
				ev := h.waitEvent(h.orgID, s.resp.Header.Get(GenerationHeader))
				if ev.Status != "rejected" || ev.HTTPStatus != 400 || ev.CompletionTokens != tc.completionTokens {
					t.Errorf("event %+v", ev)
				}
				wantCost := h.mustCost("qwen3-32b", 0, 0, 0)
				if tc.completionTokens > 0 {
					wantCost = h.mustCost("qwen3-32b", ev.PromptTokens, 0, tc.completionTokens)
					if ev.PromptTokens != 3 || ev.Estimated {
						t.Errorf("event %+v, want the exact prompt of 3 tokens from continuous usage", ev)
					}
				}
				if ev.Cost != wantCost || before-h.balance(h.orgID) != wantCost {
					t.Errorf("cost %s, balance fell by %s; want %s", ev.Cost, before-h.balance(h.orgID), wantCost)
				}
				// The breaker opens on one failure once two organizations have drawn some: had the
				// refusal counted, another organization's 500 would now open it.
				if r := h.do(req{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "x [[sim:status=500]]"), key: keyB}); r.status != 502 {
					t.Fatalf("another organization's 500: %d %s", r.status, r.body)
				}
				if r := h.do(req{path: "/v1/chat/completions", body: chatBody("qwen3-32b", "fine [[sim:tokens=1]]"), key: keyB}); r.status != 200 {
					t.Errorf("after the refusal and another organization's 500: %d %s, want 200", r.status, r.body)
				}
			})
		}
	})
}

// paramIs reports whether an error's param is want ("" for null).
func paramIs(p *string, want string) bool {
	if want == "" {
		return p == nil
	}
	return p != nil && *p == want
}

// replayBackend answers each request with the recorded payload its body names
// ("REPLAY=file"), from testdata/backend, with the status given for it; the lines of the file
// that start with "# " say where the payload comes from and are not sent.
func replayBackend(t *testing.T, statuses map[string]int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		_, name, ok := strings.Cut(body.String(), "REPLAY=")
		if !ok {
			http.Error(w, "no REPLAY= in the request", 500)
			return
		}
		name = name[:strings.IndexAny(name, ` "`)]
		if name == "fail500" {
			http.Error(w, "Internal Server Error", 500)
			return
		}
		if name == "huge" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			_, _ = w.Write(hugeEcho())
			return
		}
		raw, err := os.ReadFile(filepath.Join("testdata", "backend", name))
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		var payload []byte
		for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
			if !bytes.HasPrefix(line, []byte("# ")) {
				payload = append(payload, line...)
			}
		}
		if strings.HasSuffix(name, ".sse") {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
			payload = bytes.TrimSpace(payload)
		}
		w.WriteHeader(statuses[name])
		_, _ = w.Write(payload)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// hugeEcho is a vLLM 400 whose message repeats a 200 KB prompt, larger than the gateway reads of
// an error body.
func hugeEcho() []byte {
	prompt := strings.Repeat("SECRET-PROMPT ", 15000)
	msg := "1 validation error for ChatCompletionRequest\n  Value error, the prompt is too strange [type=value_error, input_value={'model': 'Org/Secret-Model-7B', 'messages': [{'role': 'user', 'content': '" + prompt + "'}]}, input_type=dict]"
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "BadRequestError", "param": nil, "code": 400}})
	return b
}

// syncBuffer is a log destination the handler and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// TestBackendMessagesCleaned checks issue 17's points 4 to 6 against the servers' recorded
// payloads: the client gets the backend's message without the backend's model name, without
// what the gateway injected or the request that pydantic repeats, without raw JSON, at most
// 500 bytes, with the backend's param; the log keeps the message with the generation id, and
// never the prompt. vLLM's 501 is the client's 400, and neither counts against the backend.
func TestBackendMessagesCleaned(t *testing.T) {
	t.Parallel()
	backend := replayBackend(t, map[string]int{
		"vllm-validation-echo.json": 400, "vllm-validation-parameter.json": 400, "vllm-not-implemented.json": 501,
		"sglang-flat.json": 400, "fastapi-detail.json": 422,
		"vllm-stream-logprobs.sse": 200, "sglang-stream-context.sse": 200, "vllm-stream-generation-error.sse": 200,
		"vllm-engine-dead-400.json": 400,
	})
	logs := &syncBuffer{}
	h := newHarness(t,
		config{extraModels: extraModel("replay", backendYAML("replay-1", backend.URL+"/v1", "Org/Secret-Model-7B")+"        continuous_usage: true\n")},
		config{gateway: func(o *Options) { o.Logger = slog.New(slog.NewJSONHandler(logs, nil)) }},
		config{upstream: func(o *upstream.Options) { o.FailureThreshold = 1; o.OpenFor = time.Minute }},
	)
	keyB, _ := h.newOrg("org_other", initialCredits, 8)
	for _, tc := range []struct {
		name, file    string
		stream        bool
		message       string // exactly, or with prefix the start of a longer one
		prefix        bool
		param         string
		status        string // the usage event's
		streamFailure bool   // an upstream_stream_error, not a refusal
	}{
		{name: "pydantic repeats the forwarded body", file: "vllm-validation-echo.json", stream: true,
			message: "Value error, when using `top_logprobs`, `logprobs` must be set to true."},
		{name: "VLLMValidationError", file: "vllm-validation-parameter.json",
			message: "'max_tokens' or 'max_completion_tokens' is too large: 50000. This model's maximum context length is 4096 tokens and your request has 3 input tokens (50000 > 4096 - 3). replay", param: "max_tokens"},
		{name: "501 not implemented", file: "vllm-not-implemented.json", message: "json_object is not supported"},
		{name: "SGLang's flat body", file: "sglang-flat.json",
			message: "The input (5000 tokens) is longer than the model's context length (4096 tokens)."},
		{name: "FastAPI's detail", file: "fastapi-detail.json", message: "messages[0].role: Field required"},
		{name: "a message beyond the read limit", file: "huge", prefix: true,
			message: "1 validation error for ChatCompletionRequest\n  Value error, the prompt is too strange [type=value_error, input_value=…"},
		{name: "vLLM's engine, in the stream", file: "vllm-stream-logprobs.sse", stream: true,
			message: "Requested sample logprobs of 25, which is greater than max allowed: 20", param: "logprobs"},
		{name: "SGLang's context check, in the stream", file: "sglang-stream-context.sse", stream: true,
			message: "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of 50003 tokens: 3 tokens from the input messages and 50000 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := []string{}
			if tc.stream {
				extra = append(extra, `"stream":true`)
			}
			body := chatBody("replay", "my secret prompt SECRET-PROMPT REPLAY="+tc.file, extra...)
			var e apiErr
			var genID string
			if strings.HasSuffix(tc.file, ".sse") {
				s := h.stream(req{path: "/v1/chat/completions", body: body, key: h.key})
				genID = s.resp.Header.Get(GenerationHeader)
				evs := dataEvents(s.all())
				c := parseChunk(t, evs[len(evs)-1].data)
				if s.resp.StatusCode != 200 || c.Error == nil {
					t.Fatalf("status %d, last event %s", s.resp.StatusCode, evs[len(evs)-1].data)
				}
				e = *c.Error
			} else {
				r := h.do(req{path: "/v1/chat/completions", body: body, key: h.key})
				if r.status != 400 {
					t.Fatalf("status %d %s, want 400", r.status, r.body)
				}
				genID, e = r.genID(), r.errorBody(t)
			}
			if (tc.prefix && !strings.HasPrefix(e.Message, tc.message)) || (!tc.prefix && e.Message != tc.message) {
				t.Errorf("message %q\nwant      %q", e.Message, tc.message)
			}
			if len(e.Message) > maxBackendMessage+len("…") || strings.Contains(e.Message, "Secret-Model") ||
				strings.Contains(e.Message, "SECRET-PROMPT") || strings.Contains(e.Message, "stream_options") || strings.Contains(e.Message, `{"`) {
				t.Errorf("message %q: too long, or names the backend's model, the prompt, what the gateway injected, or raw JSON", e.Message)
			}
			if e.Type != "invalid_request_error" || e.Code != nil || !paramIs(e.Param, tc.param) {
				t.Errorf("error %+v, param %s; want invalid_request_error, code null, param %q", e, deref(e.Param), tc.param)
			}
			ev := h.waitEvent(h.orgID, genID)
			if ev.Status != "rejected" || ev.HTTPStatus != 400 || ev.Cost != 0 {
				t.Errorf("event %+v", ev)
			}
			logged := logs.String()
			if strings.Contains(logged, "SECRET-PROMPT") {
				t.Error("the prompt reached the log")
			}
			found := false
			for _, line := range strings.Split(logged, "\n") {
				if strings.Contains(line, genID) && strings.Contains(line, `"msg":"backend refused the request"`) && strings.Contains(line, `"backend_message"`) {
					found = true
				}
			}
			if !found {
				t.Errorf("no log line of the refusal with generation id %s:\n%s", genID, logged)
			}
			// The breaker opens on one failure once two organizations have drawn some: had the
			// refusal counted, another organization's 500 would now open it.
			if r := h.do(req{path: "/v1/chat/completions", body: chatBody("replay", "REPLAY=fail500"), key: keyB}); r.status != 502 {
				t.Fatalf("another organization's 500: %d %s", r.status, r.body)
			}
			if r := h.do(req{path: "/v1/chat/completions", body: chatBody("replay", "REPLAY=vllm-not-implemented.json"), key: keyB}); r.status != 400 {
				t.Errorf("after the refusal: %d %s, want the backend's 400 again", r.status, r.body)
			}
		})
	}

	t.Run("an engine failure answered with 400", func(t *testing.T) {
		r := h.do(req{path: "/v1/chat/completions", body: chatBody("replay", "x REPLAY=vllm-engine-dead-400.json"), key: h.key})
		if r.status != 502 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") || strings.Contains(string(r.body), "EngineCore") {
			t.Fatalf("%d %q %s, want the plain-text 502 without the backend's text", r.status, r.header.Get("Content-Type"), r.body)
		}
		if ev := h.waitEvent(h.orgID, r.genID()); ev.Status != "upstream_error" || ev.HTTPStatus != 502 || ev.Cost != 0 {
			t.Errorf("event %+v", ev)
		}
	})

	t.Run("an engine failure in the stream", func(t *testing.T) {
		s := h.stream(req{path: "/v1/chat/completions", body: chatBody("replay", "x REPLAY=vllm-stream-generation-error.sse", `"stream":true`), key: h.key})
		evs := dataEvents(s.all())
		c := parseChunk(t, evs[len(evs)-1].data)
		if c.Error == nil || deref(c.Error.Code) != "upstream_stream_error" || strings.Contains(c.Error.Message, "Internal server error") {
			t.Fatalf("last event %s, want the gateway's upstream_stream_error", evs[len(evs)-1].data)
		}
		ev := h.waitEvent(h.orgID, s.resp.Header.Get(GenerationHeader))
		if ev.Status != "upstream_error" || ev.PromptTokens != 3 || ev.CompletionTokens != 1 || ev.Estimated {
			t.Errorf("event %+v, want the generated token billed exactly", ev)
		}
	})
}

// TestCutStreamBilling checks issue 17's second point on both servers: a stream cut before its
// final usage chunk is billed from the backend's running usage of every choice (n > 1, every
// prompt of a prompt array) where each has reported, exactly; estimated where some choice has
// not, where the backend reports cached tokens (per-chunk usage never carries them), or where
// it sends no running usage (SGLang's completions); the estimate is then the same count.
func TestCutStreamBilling(t *testing.T) {
	t.Parallel()
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		cacheModel := extraModel("cache-model", backendYAML("cache-1", "SIM_URL", "Qwen/Qwen3-32B")+"        continuous_usage: true\n        cached_tokens: true\n")
		h := newHarness(t, config{server: server, extraModels: cacheModel})
		sglang := server == catalog.ServerSGLang
		for _, tc := range []struct {
			name, path, model, body     string
			prompt, completion          int64
			estimated                   bool
			minCompletion, maxPromptErr int64 // estimated cases: bounds
		}{
			{name: "n=2, every choice reported", path: "/v1/chat/completions", model: "qwen3-32b",
				body:   chatBody("qwen3-32b", "C1 two [[sim:drop_after=5]]", `"stream":true`, `"max_tokens":10`, `"n":2`),
				prompt: 3, completion: 5},
			{name: "prompt array, every choice reported", path: "/v1/completions", model: "qwen3-32b",
				body:   `{"model":"qwen3-32b","prompt":["C2 a b c","d e [[sim:drop_after=4]]"],"max_tokens":10,"stream":true}`,
				prompt: 7, completion: 4, estimated: sglang}, // SGLang's completions stream has no running usage
			{name: "prompt array and n=2", path: "/v1/completions", model: "qwen3-32b",
				body:   `{"model":"qwen3-32b","prompt":["C3 a","b c d [[sim:drop_after=9]]"],"n":2,"max_tokens":10,"stream":true}`,
				prompt: 6, completion: 9, estimated: sglang},
			{name: "a choice that never reported", path: "/v1/chat/completions", model: "qwen3-32b",
				body:   chatBody("qwen3-32b", "C4 two [[sim:drop_after=1]]", `"stream":true`, `"max_tokens":10`, `"n":2`),
				prompt: 3, completion: 1, estimated: sglang}, // vLLM's role chunk reports every choice, SGLang's none
			{name: "cached tokens reported only at the end", path: "/v1/chat/completions", model: "cache-model",
				body:   chatBody("cache-model", "C5 two three [[sim:cached=3]] [[sim:drop_after=2]]", `"stream":true`, `"max_tokens":10`),
				prompt: 5, completion: 2, estimated: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := h.stream(req{path: tc.path, body: tc.body, key: h.key})
				if s.resp.StatusCode != 200 {
					t.Fatalf("status %d", s.resp.StatusCode)
				}
				s.all()
				ev := h.waitEvent(h.orgID, s.resp.Header.Get(GenerationHeader))
				if ev.Status != "upstream_error" || ev.Estimated != tc.estimated || ev.PromptTokens != tc.prompt || ev.CompletionTokens != tc.completion || ev.CachedTokens != 0 {
					t.Errorf("event %+v, want prompt %d, completion %d, estimated %v, no cached tokens", ev, tc.prompt, tc.completion, tc.estimated)
				}
				if want := h.mustCost(tc.model, ev.PromptTokens, 0, ev.CompletionTokens); ev.Cost != want {
					t.Errorf("cost %s, want %s", ev.Cost, want)
				}
			})
		}
	})
}

// TestPromptEstimate pins the disconnect estimate of prompt tokens (issue 16, point 8): one token
// per whitespace-separated word and per token id, no chat template. That is the simulator's count
// exactly, which the test checks against the simulator itself, and a lower bound for real
// tokenizers.
func TestPromptEstimate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, tc := range []struct {
		name string
		chat bool
		body string
		want int64
	}{
		{"one message", true, `{"model":"qwen3-32b","messages":[{"role":"user","content":"Hello there, how are you?"}]}`, 5},
		{"every message and text part", true, `{"model":"qwen3-32b","messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":[{"type":"text","text":"look at"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"this  one\n"}]},{"role":"assistant","content":null}]}`, 6},
		{"no text", true, `{"model":"qwen3-32b","messages":[{"role":"user","content":""}]}`, 0},
		{"a prompt", false, `{"model":"qwen3-32b","prompt":"The capital of France is"}`, 5},
		{"a prompt array", false, `{"model":"qwen3-32b","prompt":["a b","c d e"]}`, 5},
		{"token ids", false, `{"model":"qwen3-32b","prompt":[1,2,3,4]}`, 4},
		{"lists of token ids", false, `{"model":"qwen3-32b","prompt":[[1,2],[3]]}`, 3},
		{"not JSON", false, `{"model":`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := estimatePromptTokens(tc.chat, []byte(tc.body)); got != tc.want {
				t.Errorf("estimate %d, want %d", got, tc.want)
			}
			if tc.want == 0 {
				return
			}
			path := "/v1/completions"
			if tc.chat {
				path = "/v1/chat/completions"
			}
			// The simulator counts the same prompt the same way.
			body := strings.TrimSuffix(strings.Replace(tc.body, `"qwen3-32b"`, `"Qwen/Qwen3-32B"`, 1), "}") + `,"max_tokens":1}`
			resp, err := http.Post(h.simURL+strings.TrimPrefix(path, "/v1"), "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var v struct {
				Usage struct {
					PromptTokens int64 `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Usage.PromptTokens != tc.want {
				t.Errorf("simulator counts %d prompt tokens (%v), the estimate %d", v.Usage.PromptTokens, err, tc.want)
			}
		})
	}
}

// TestBackendMessage is the cleaning rule, case by case: what the client reads of a backend's
// message, and what the log keeps.
func TestBackendMessage(t *testing.T) {
	injected := []string{"continuous_usage_stats", "include_usage", "stream_options"}
	long := strings.Repeat("é", 400) // 800 bytes
	for _, tc := range []struct {
		name, raw      string
		injected       []string
		client, logged string
	}{
		{name: "plain", raw: "max_tokens must be at least 1, got 0.", client: "max_tokens must be at least 1, got 0.", logged: "max_tokens must be at least 1, got 0."},
		{name: "the backend's model becomes the public id", raw: "The model `Org/M-7B` does not support tools.", client: "The model `pub` does not support tools."},
		{name: "vLLM's parameter suffix", raw: "Requested sample logprobs of 25, which is greater than max allowed: 20 (parameter=logprobs, value=25)", client: "Requested sample logprobs of 25, which is greater than max allowed: 20"},
		{name: "pydantic's list, input dropped",
			raw:    "[{'type': 'missing', 'loc': ('body', 'messages', 0, 'role'), 'msg': 'Field required', 'input': {'content': 'SECRET (with) [brackets] {and} \\'quotes\\''}}, {'type': 'int_type', 'loc': ('body', 'n'), 'msg': 'Input should be a valid integer', 'input': 'two'}]",
			client: "messages[0].role: Field required; n: Input should be a valid integer",
			logged: "[{'type': 'missing', 'loc': ('body', 'messages', 0, 'role'), 'msg': 'Field required', 'input': …}, {'type': 'int_type', 'loc': ('body', 'n'), 'msg': 'Input should be a valid integer', 'input': …}]"},
		{name: "pydantic's text, input_value dropped", raw: "Value error, bad [type=value_error, input_value={'a': 'SECRET, more'}, input_type=dict]",
			client: "Value error, bad [type=value_error, input_value=…, input_type=dict]", logged: "Value error, bad [type=value_error, input_value=…, input_type=dict]"},
		{name: "pydantic's list written as JSON, input dropped",
			raw:    `[{"type": "missing", "loc": ["body", "messages", 0, "role"], "msg": "Field required", "input": {"content": "SECRET, \"quoted\""}}, {"type":"int_type","loc":["body","n"],"msg":"Input should be a valid integer","input":"SECRET two"}]`,
			client: "The model server rejected the request.",
			logged: `[{"type": "missing", "loc": ["body", "messages", 0, "role"], "msg": "Field required", "input": …}, {"type":"int_type","loc":["body","n"],"msg":"Input should be a valid integer","input":…}]`},
		{name: "an echo cut short", raw: "Value error [input_value={'messages': [{'content': 'SECRET",
			client: "Value error [input_value=…", logged: "Value error [input_value=…"},
		{name: "about what the gateway injected", raw: "continuous_usage_stats is not supported", injected: injected, client: "The model server rejected the request."},
		{name: "about what the client sent", raw: "continuous_usage_stats is not supported", client: "continuous_usage_stats is not supported"},
		{name: "raw JSON", raw: `{"unexpected":"shape"}`, client: "The model server rejected the request."},
		{name: "HTML", raw: "<html>413 Request Entity Too Large</html>", client: "The model server rejected the request."},
		{name: "empty", raw: "  ", client: "The model server rejected the request."},
		{name: "bounded at a character boundary", raw: long, client: strings.Repeat("é", 250) + "…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, logged := backendMessage(tc.raw, "Org/M-7B", "pub", tc.injected)
			if client != tc.client {
				t.Errorf("client %q\nwant   %q", client, tc.client)
			}
			if tc.logged != "" && logged != tc.logged {
				t.Errorf("logged %q\nwant   %q", logged, tc.logged)
			}
			if strings.Contains(logged, "SECRET") {
				t.Errorf("logged %q keeps the request's content", logged)
			}
		})
	}
}

// TestValidationEchoCleaned sends the gateway's simulated vLLM a request that one of vLLM's
// pydantic validators refuses: the backend's message repeats the forwarded body (its model name
// Qwen/Qwen3-32B, the stream_options the gateway injected, the prompt), and the client reads only
// the validator's words.
func TestValidationEchoCleaned(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	h := newHarness(t, config{gateway: func(o *Options) { o.Logger = slog.New(slog.NewJSONHandler(logs, nil)) }})
	r := h.do(req{path: "/v1/chat/completions", key: h.key, body: chatBody("qwen3-32b", "V1 my SECRET-PROMPT", `"stream":true`, `"top_logprobs":5`)})
	if r.status != 400 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	_, upstream := h.rec.find(t, "V1 my SECRET-PROMPT")
	if !bytes.Contains(upstream, []byte("Qwen/Qwen3-32B")) || !bytes.Contains(upstream, []byte("continuous_usage_stats")) || !bytes.Contains(upstream, []byte("SECRET-PROMPT")) {
		t.Fatalf("the simulator's message %s does not repeat the forwarded body", upstream)
	}
	e := r.errorBody(t)
	if e.Message != "Value error, when using `top_logprobs`, `logprobs` must be set to true." || e.Param != nil || e.Code != nil {
		t.Errorf("error %+v", e)
	}
	if strings.Contains(logs.String(), "SECRET-PROMPT") || !strings.Contains(logs.String(), r.genID()) {
		t.Errorf("log %s: the prompt reached it, or the refusal is not logged with its generation id", logs.String())
	}
}

// TestPromptEstimateCountsBesideHugeNumbers: a number no float64 holds (1e400), which a request
// may carry where the backend ignores it, leaves the rest of the prompt counted.
func TestPromptEstimateCountsBesideHugeNumbers(t *testing.T) {
	for _, tc := range []struct {
		chat bool
		body string
		want int64
	}{
		{true, `{"model":"qwen3-32b","messages":[{"role":"user","content":[{"type":"text","text":"a b c d e f","x":1e400}]},{"role":"user","content":"g h"}]}`, 8},
		{false, `{"model":"qwen3-32b","prompt":[1,2,3,1e400]}`, 4},
	} {
		if got := estimatePromptTokens(tc.chat, []byte(tc.body)); got != tc.want {
			t.Errorf("estimate of %s: %d, want %d", tc.body, got, tc.want)
		}
	}
}

// TestParseBackendErrorNameTwice reads a backend's error body that writes a name twice as any
// other server text is read (openai.DecodeLast): the last one counts, nested or not, rather than
// the body falling back to the first "message" its bytes hold.
func TestParseBackendErrorNameTwice(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      backendError
	}{
		{name: "nested in vLLM's error", raw: `{"error":{"message":"first","message":"last","param":"n","code":400}}`,
			want: backendError{status: 400, message: "last", param: "n"}},
		{name: "SGLang's flat body", raw: `{"object":"error","message":"first","code":422,"message":"last"}`,
			want: backendError{status: 422, message: "last"}},
		{name: "in FastAPI's detail list", raw: `{"detail":[{"loc":["body","n"],"msg":"first","msg":"last"}]}`,
			want: backendError{message: "n: last"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be, ok := parseBackendError([]byte(tc.raw))
			if !ok || be != tc.want {
				t.Errorf("parseBackendError = %+v, %v; want %+v", be, ok, tc.want)
			}
		})
	}
}

// TestParseBackendErrorDetail renders FastAPI's list of pydantic errors as the Python text of
// one is rendered (TestBackendMessage): an index as [n], without the "body" the location starts with.
func TestParseBackendErrorDetail(t *testing.T) {
	// A client's key as a location part is decoded, escapes and all, and a name of digits is a name.
	raw := `{"detail":[{"loc":["body","messages",0,"role"],"msg":"Field required"},{"loc":["query","n"],"msg":"Input should be a valid integer"},` +
		`{"loc":["body","logit_bias","a\"b\u00e9","0"],"msg":"Extra inputs are not permitted"}]}`
	want := `messages[0].role: Field required; query.n: Input should be a valid integer; logit_bias.a"bé.0: Extra inputs are not permitted`
	if be, ok := parseBackendError([]byte(raw)); !ok || be.message != want {
		t.Errorf("parseBackendError = %+v, %v; want message %q", be, ok, want)
	}
}
