package gateway

import (
	"bytes"
	"encoding/json"
	"github.com/neocloud/kiln/pkg/catalog"
	"strings"
	"testing"
	"time"
)

// TestNonStreamingResponse checks that a non-streamed answer is the backend's body with only
// usage.cost added and the public model id restored, with the seed pages' exact costs.
func TestNonStreamingResponse(t *testing.T) {
	t.Parallel()
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		h := newHarness(t, config{server: server})
		tests := []struct {
			name, path, body, model, backendModel string
			prompt, cached, completion            int64
			cost                                  string
		}{
			{
				name: "seed chat figures", path: "/v1/chat/completions", model: "gpt-oss-120b", backendModel: "openai/gpt-oss-120b",
				body:   `{"model":"gpt-oss-120b","messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"N1 two three four five six seven"}],"max_tokens":12}`,
				prompt: 9, completion: 12, cost: "0.000001155",
			},
			{
				name: "seed completions figures", path: "/v1/completions", model: "gpt-oss-120b", backendModel: "openai/gpt-oss-120b",
				body:   `{"model":"gpt-oss-120b","prompt":"N2 capital of France is","max_tokens":7}`,
				prompt: 5, completion: 7, cost: "0.000000665",
			},
			{
				// 5 uncached × 0.035 + 4 cached × 0.0175 + 12 × 0.07 per million.
				name: "cached tokens at cached_input", path: "/v1/chat/completions", model: "gpt-oss-120b", backendModel: "openai/gpt-oss-120b",
				body:   `{"model":"gpt-oss-120b","messages":[{"role":"user","content":"N3 two three four five six seven eight [[sim:cached=4]]"}],"max_tokens":12}`,
				prompt: 9, cached: 4, completion: 12, cost: "0.000001085",
			},
			{
				name: "qwen3-32b", path: "/v1/chat/completions", model: "qwen3-32b", backendModel: "Qwen/Qwen3-32B",
				body:   `{"model":"qwen3-32b","messages":[{"role":"user","content":"N4 [[sim:tokens=3]]"}]}`,
				prompt: 2, completion: 3, cost: "0.00000084",
			},
			{
				name: "tool call", path: "/v1/chat/completions", model: "qwen3-32b", backendModel: "Qwen/Qwen3-32B",
				body:   `{"model":"qwen3-32b","messages":[{"role":"user","content":"N5 [[sim:tool_call=get_weather]]"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather."}}]}`,
				prompt: 2, completion: 8, cost: "0.000002040",
			},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if c := h.mustCost(tc.model, tc.prompt, tc.cached, tc.completion); c.String() != strings.TrimRight(tc.cost, "0") {
					t.Fatalf("test table: cost %s, computed %s", tc.cost, c)
				}
				r := h.do(req{path: tc.path, body: tc.body, key: h.key})
				if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
					t.Fatalf("%d %q %s", r.status, r.header.Get("Content-Type"), r.body)
				}
				_, upstreamBody := h.rec.find(t, strings.Fields(tc.body[strings.Index(tc.body, "N"):])[0])
				want := expectedBody(t, upstreamBody, tc.backendModel, tc.model, strings.TrimRight(tc.cost, "0"))
				if !bytes.Equal(bytes.TrimSpace(r.body), want) {
					t.Errorf("body\n%s\nwant\n%s", r.body, want)
				}
				if !bytes.Contains(r.body, []byte(`"cost":`+strings.TrimRight(tc.cost, "0"))) {
					t.Errorf("body %s lacks the plain decimal cost %s", r.body, tc.cost)
				}
				if !genIDPattern.MatchString(r.genID()) {
					t.Fatalf("generation id %q", r.genID())
				}
				ev := h.waitEvent(h.orgID, r.genID())
				if ev.GenerationID != r.genID() || ev.Status != "completed" || ev.HTTPStatus != 200 || ev.Model != tc.model ||
					ev.PromptTokens != tc.prompt || ev.CachedTokens != tc.cached || ev.CompletionTokens != tc.completion ||
					ev.Cost.String() != strings.TrimRight(tc.cost, "0") || ev.Estimated || ev.Stream || ev.Endpoint != tc.path || ev.KeyID != h.keyID {
					t.Errorf("event %+v", ev)
				}
			})
		}
	})
}

// expectedBody is the backend's body with the model renamed and usage.cost added.
func expectedBody(t *testing.T, upstream []byte, backendModel, model, cost string) []byte {
	t.Helper()
	upstream = bytes.TrimSpace(upstream)
	var v struct {
		Usage json.RawMessage `json:"usage"`
	}
	if err := json.Unmarshal(upstream, &v); err != nil || len(v.Usage) == 0 {
		t.Fatalf("backend body %s: %v", upstream, err)
	}
	withCost := append(bytes.TrimSuffix([]byte(v.Usage), []byte("}")), `,"cost":`+cost+`}`...)
	out := bytes.Replace(upstream, v.Usage, withCost, 1)
	return bytes.Replace(out, []byte(`"model":"`+backendModel+`"`), []byte(`"model":"`+model+`"`), 1)
}

// TestStreamingResponse reads streams from the wire and checks the relay's rules: model
// restored, per-chunk usage removed, the usage chunk with its cost only when asked for, [DONE].
func TestStreamingResponse(t *testing.T) {
	t.Parallel()
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		h := newHarness(t, config{server: server})
		tests := []struct {
			name               string
			path, body, model  string
			wantUsage          bool
			prompt, completion int64
			cost               string
			finish             string
		}{
			{name: "qwen3-32b with usage", path: "/v1/chat/completions", model: "qwen3-32b",
				body:      chatBody("qwen3-32b", "T1 [[sim:tokens=5]]", `"stream":true`, `"stream_options":{"include_usage":true}`),
				wantUsage: true, prompt: 2, completion: 5, cost: "0.00000132", finish: "stop"},
			{name: "qwen3-32b without usage", path: "/v1/chat/completions", model: "qwen3-32b",
				body:   chatBody("qwen3-32b", "T2 [[sim:tokens=5]]", `"stream":true`),
				prompt: 2, completion: 5, cost: "0.00000132", finish: "stop"},
			{name: "qwen3-32b include_usage false", path: "/v1/completions", model: "qwen3-32b",
				body:   `{"model":"qwen3-32b","prompt":"T3 a b","max_tokens":4,"stream":"true","stream_options":{"include_usage":false}}`,
				prompt: 3, completion: 4, cost: "0.00000114", finish: "length"},
			{name: "gpt-oss seed figures", path: "/v1/chat/completions", model: "gpt-oss-120b",
				body:      `{"model":"gpt-oss-120b","messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"T4 two three four five six seven"}],"max_tokens":12,"stream":1,"stream_options":{"include_usage":true}}`,
				wantUsage: true, prompt: 9, completion: 12, cost: "0.000001155", finish: "length"},
			{name: "gpt-oss completions seed figures", path: "/v1/completions", model: "gpt-oss-120b",
				body:      `{"model":"gpt-oss-120b","prompt":"T5 capital of France is","max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
				wantUsage: true, prompt: 5, completion: 7, cost: "0.000000665", finish: "length"},
			{name: "gpt-oss without usage", path: "/v1/completions", model: "gpt-oss-120b",
				body:   `{"model":"gpt-oss-120b","prompt":"T6 capital of France is","max_tokens":7,"stream":true}`,
				prompt: 5, completion: 7, cost: "0.000000665", finish: "length"},
			{name: "tool call", path: "/v1/chat/completions", model: "gpt-oss-120b",
				body:      chatBody("gpt-oss-120b", "T7 [[sim:tool_call=get_weather]]", `"stream":true`, `"stream_options":{"include_usage":true}`, `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather."}}]`),
				wantUsage: true, prompt: 2, completion: 8, cost: "0.00000063", finish: "tool_calls"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if c := h.mustCost(tc.model, tc.prompt, 0, tc.completion); c.String() != tc.cost {
					t.Fatalf("test table: cost %s, computed %s", tc.cost, c)
				}
				s := h.stream(req{path: tc.path, body: tc.body, key: h.key})
				if s.resp.StatusCode != 200 || s.resp.Header.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("%d %q", s.resp.StatusCode, s.resp.Header.Get("Content-Type"))
				}
				genID := s.resp.Header.Get(GenerationHeader)
				if !genIDPattern.MatchString(genID) {
					t.Errorf("generation id %q", genID)
				}
				evs := s.all()
				if len(evs) < 3 {
					t.Fatalf("%d events", len(evs))
				}
				if last := evs[len(evs)-1]; last.data != "[DONE]" {
					t.Errorf("last event %q, want [DONE]", last.data)
				}
				var usageChunks, content int
				finish := ""
				for _, ev := range evs[:len(evs)-1] {
					if ev.comment != "" {
						continue
					}
					if strings.Contains(ev.data, "[DONE]") {
						t.Errorf("[DONE] before the end")
					}
					c := parseChunk(t, ev.data)
					if c.Model != tc.model {
						t.Errorf("chunk model %q, want %q", c.Model, tc.model)
					}
					if c.hasContent() {
						content++
					}
					for _, ch := range c.Choices {
						if ch.FinishReason != nil {
							finish = *ch.FinishReason
						}
					}
					if len(c.Choices) == 0 {
						usageChunks++
						if !strings.Contains(ev.data, `"cost":`+tc.cost+`}`) {
							t.Errorf("usage chunk %s lacks cost %s", ev.data, tc.cost)
						}
						var u struct {
							PromptTokens, CompletionTokens, TotalTokens int64
						}
						_ = json.Unmarshal(c.Usage, &u)
						if u.PromptTokens != 0 && (u.PromptTokens != tc.prompt || u.CompletionTokens != tc.completion) {
							t.Errorf("usage %s", c.Usage)
						}
					} else if c.Usage != nil && string(c.Usage) != "null" || strings.Contains(ev.data, `"usage"`) {
						t.Errorf("content chunk carries usage: %s", ev.data)
					}
				}
				if tc.wantUsage && usageChunks != 1 {
					t.Errorf("%d usage chunks, want 1", usageChunks)
				}
				if !tc.wantUsage && usageChunks != 0 {
					t.Errorf("%d usage chunks, want none", usageChunks)
				}
				if finish != tc.finish {
					t.Errorf("finish reason %q, want %q", finish, tc.finish)
				}
				if tc.finish != "tool_calls" && int64(content) != tc.completion {
					t.Errorf("%d content chunks, want %d", content, tc.completion)
				}
				ev := h.waitEvent(h.orgID, genID)
				if ev.Status != "completed" || !ev.Stream || ev.PromptTokens != tc.prompt || ev.CompletionTokens != tc.completion ||
					ev.Cost.String() != tc.cost || ev.Estimated || ev.FinishReason != tc.finish || ev.TTFTMillis <= 0 {
					t.Errorf("event %+v", ev)
				}
			})
		}
	})
}

// TestStreamIsIncremental checks that each event reaches the client as the backend sends it.
func TestStreamIsIncremental(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const delay = 80 * time.Millisecond
	const tokens = 6
	s := h.stream(req{path: "/v1/chat/completions", key: h.key,
		body: chatBody("gpt-oss-120b", "inc [[sim:delay_ms=80]]", `"max_tokens":6`, `"stream":true`)})
	var firstContent time.Duration
	evs := s.all()
	for _, ev := range dataEvents(evs) {
		if ev.data != "[DONE]" && parseChunk(t, ev.data).hasContent() {
			firstContent = ev.at
			break
		}
	}
	end := evs[len(evs)-1].at
	if firstContent == 0 {
		t.Fatal("no content")
	}
	// The backend needs tokens × delay; the first token must arrive after about one delay, long
	// before the end.
	if end-firstContent < (tokens-2)*delay {
		t.Errorf("first content at %v, end at %v: the stream was buffered", firstContent, end)
	}
}

// TestKeepalive checks that a silent backend gets ": keepalive" comments to the client.
func TestKeepalive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{gateway: func(o *Options) { o.Keepalive = 40 * time.Millisecond }})
	s := h.stream(req{path: "/v1/chat/completions", key: h.key,
		body: chatBody("qwen3-32b", "ka [[sim:delay_ms=250]]", `"max_tokens":2`, `"stream":true`)})
	evs := s.all()
	var keepalives, data int
	for _, ev := range evs {
		switch {
		case ev.comment == ": keepalive":
			keepalives++
		case ev.comment != "":
			t.Errorf("comment %q", ev.comment)
		default:
			data++
		}
	}
	if keepalives < 3 {
		t.Errorf("%d keepalives in 500 ms of silence with a 40 ms keepalive", keepalives)
	}
	if evs[len(evs)-1].data != "[DONE]" {
		t.Errorf("stream did not end with [DONE]")
	}

	// A stream whose events are frequent gets none. Events 5 ms apart against a 250 ms keepalive,
	// on a gateway of its own: a busy machine may stall a stream for 40 ms, not for 250.
	h = newHarness(t, config{gateway: func(o *Options) { o.Keepalive = 250 * time.Millisecond }})
	s = h.stream(req{path: "/v1/chat/completions", key: h.key,
		body: chatBody("qwen3-32b", "busy [[sim:delay_ms=5]]", `"max_tokens":20`, `"stream":true`)})
	for _, ev := range s.all() {
		if ev.comment != "" {
			t.Errorf("keepalive %q in a busy stream", ev.comment)
		}
	}
}

// TestStreamBreaks checks a failure after the first streamed byte: a final error event, no
// [DONE], and the delivered tokens billed.
func TestStreamBreaks(t *testing.T) {
	t.Parallel()
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		h := newHarness(t, config{server: server})
		tests := []struct {
			name      string
			model     string
			body      string
			estimated bool
			prompt    int64 // exact prompt tokens, when the backend reported them
		}{
			{name: "continuous usage", model: "qwen3-32b", body: chatBody("qwen3-32b", "drop [[sim:drop_after=3]]", `"max_tokens":10`, `"stream":true`, `"stream_options":{"include_usage":true}`), prompt: 2},
			{name: "no continuous usage", model: "gpt-oss-120b", body: chatBody("gpt-oss-120b", "drop [[sim:drop_after=3]]", `"max_tokens":10`, `"stream":true`), estimated: true},
			{name: "completions", model: "gpt-oss-120b", body: `{"model":"gpt-oss-120b","prompt":"drop [[sim:drop_after=3]]","max_tokens":10,"stream":true}`, estimated: true},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				path := "/v1/chat/completions"
				if strings.Contains(tc.body, `"prompt"`) {
					path = "/v1/completions"
				}
				before := h.balance(h.orgID)
				s := h.stream(req{path: path, body: tc.body, key: h.key})
				if s.resp.StatusCode != 200 {
					t.Fatalf("status %d", s.resp.StatusCode)
				}
				genID := s.resp.Header.Get(GenerationHeader)
				if !genIDPattern.MatchString(genID) {
					t.Errorf("generation id %q", genID)
				}
				evs := dataEvents(s.all())
				if len(evs) == 0 {
					t.Fatal("no events")
				}
				content := 0
				for _, ev := range evs[:len(evs)-1] {
					if ev.data == "[DONE]" {
						t.Fatalf("[DONE] in a broken stream")
					}
					if parseChunk(t, ev.data).hasContent() {
						content++
					}
				}
				if content != 3 {
					t.Errorf("%d content chunks delivered, want 3", content)
				}
				last := parseChunk(t, evs[len(evs)-1].data)
				if last.Error == nil || deref(last.Error.Code) != "upstream_stream_error" || last.Error.Message == "" {
					t.Fatalf("last event %s, want an upstream_stream_error", evs[len(evs)-1].data)
				}
				ev := h.waitEvent(h.orgID, genID)
				if ev.Status != "upstream_error" || ev.HTTPStatus != 200 || ev.Estimated != tc.estimated || ev.CompletionTokens < 3 || ev.Cost <= 0 {
					t.Errorf("event %+v", ev)
				}
				if tc.prompt != 0 && ev.PromptTokens != tc.prompt {
					t.Errorf("prompt tokens %d, want %d", ev.PromptTokens, tc.prompt)
				}
				if !tc.estimated && ev.CompletionTokens != 3 {
					t.Errorf("completion tokens %d, want exactly 3", ev.CompletionTokens)
				}
				if want := h.mustCost(tc.model, ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens); ev.Cost != want {
					t.Errorf("cost %s, want %s", ev.Cost, want)
				}
				if got := h.balance(h.orgID); before-got != ev.Cost {
					t.Errorf("balance fell by %s, want %s", before-got, ev.Cost)
				}
			})
		}
	})
}

// TestGenerationIDs checks that every response past authentication names its generation, and
// that the name is the recorded event's.
func TestGenerationIDs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	bodies := []struct{ path, body string }{
		{"/v1/chat/completions", chatBody("qwen3-32b", "g1 [[sim:tokens=1]]")},
		{"/v1/chat/completions", chatBody("qwen3-32b", "g2 [[sim:tokens=1]]", `"stream":true`)},
		{"/v1/completions", `{"model":"gpt-oss-120b","prompt":"g3 [[sim:status=500]]"}`},
		{"/v1/completions", `{"model":"nope","prompt":"g4"}`},
		{"/v1/chat/completions", `{`},
	}
	seen := map[string]bool{}
	for _, b := range bodies {
		r := h.do(req{path: b.path, body: b.body, key: h.key})
		id := r.genID()
		if !genIDPattern.MatchString(id) || seen[id] {
			t.Errorf("%s: generation id %q", b.body, id)
			continue
		}
		seen[id] = true
		if ev := h.waitEvent(h.orgID, id); ev.GenerationID != id || ev.HTTPStatus != r.status {
			t.Errorf("event %+v for status %d", ev, r.status)
		}
	}
}
