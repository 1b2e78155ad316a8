package simulator

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestChatCompletion(t *testing.T) {
	_, srv := newTestServer(t)
	tests := []struct {
		name    string
		body    string
		content string
		finish  string
		usage   wantUsage
	}{
		{
			name:    "max_tokens",
			body:    chatBody(qwen, "say hello", `"max_tokens":3`),
			content: "tok0 tok1 tok2", finish: "length",
			usage: wantUsage{prompt: 2, completion: 3, cached: -1},
		},
		{
			name:    "max_completion_tokens wins over max_tokens",
			body:    chatBody(qwen, "say hello", `"max_tokens":5,"max_completion_tokens":2`),
			content: "tok0 tok1", finish: "length",
			usage: wantUsage{prompt: 2, completion: 2, cached: -1},
		},
		{
			name:    "without max_tokens the model stops after 16 tokens",
			body:    chatBody(qwen, "hi", ""),
			content: "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 tok8 tok9 tok10 tok11 tok12 tok13 tok14 tok15", finish: "stop",
			usage: wantUsage{prompt: 1, completion: 16, cached: -1},
		},
		{
			name:    "tokens directive stops early",
			body:    chatBody(qwen, "count [[sim:tokens=2]]", `"max_tokens":10`),
			content: "tok0 tok1", finish: "stop",
			usage: wantUsage{prompt: 2, completion: 2, cached: -1},
		},
		{
			name:    "tokens directive at max_tokens is length",
			body:    chatBody(qwen, "count [[sim:tokens=4]]", `"max_tokens":4`),
			content: "tok0 tok1 tok2 tok3", finish: "length",
			usage: wantUsage{prompt: 2, completion: 4, cached: -1},
		},
		{
			name:    "tokens=0",
			body:    chatBody(qwen, "[[sim:tokens=0]]", ""),
			content: "", finish: "stop",
			usage: wantUsage{prompt: 1, completion: 0, cached: -1},
		},
		{
			name:    "cached directive without the cache-report flag",
			body:    chatBody(qwen, "a b c [[sim:cached=3]]", `"max_tokens":1`),
			content: "tok0", finish: "length",
			usage: wantUsage{prompt: 4, completion: 1, cached: -1},
		},
		{
			name:    "without max_tokens the answer fits the context",
			body:    chatBody(qwen, strings.Repeat("w ", 90), ""),
			content: "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 tok8 tok9", finish: "length",
			usage: wantUsage{prompt: 90, completion: 10, cached: -1},
		},
		{
			name: "all messages and content parts count, directives from the last user message",
			body: `{"model":"` + qwen + `","max_tokens":5,"messages":[
				{"role":"system","content":"be brief"},
				{"role":"user","content":"first [[sim:tokens=1]]"},
				{"role":"assistant","content":null,"tool_calls":[]},
				{"role":"user","content":[{"type":"text","text":"look at"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"this [[sim:tokens=3]]"}]}]}`,
			content: "tok0 tok1 tok2", finish: "stop",
			usage: wantUsage{prompt: 8, completion: 3, cached: -1},
		},
		{
			name:    "unknown fields are ignored",
			body:    chatBody(qwen, "hi", `"max_tokens":1,"temperature":0.7,"n":1,"stream":false,"foo":{"bar":[1]}`),
			content: "tok0", finish: "length",
			usage: wantUsage{prompt: 1, completion: 1, cached: -1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv, "/v1/chat/completions", tc.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			v := readJSON(t, resp)
			if id := at(t, v, "id").(string); !strings.HasPrefix(id, "chatcmpl-") {
				t.Errorf("id = %q", id)
			}
			if got := at(t, v, "object"); got != "chat.completion" {
				t.Errorf("object = %v", got)
			}
			if got := num(t, at(t, v, "created")); got != int(testNow.Unix()) {
				t.Errorf("created = %d", got)
			}
			if got := at(t, v, "model"); got != qwen && got != gptOSS {
				t.Errorf("model = %v", got)
			}
			choice := at(t, v, "choices", 0).(map[string]any)
			msg := choice["message"].(map[string]any)
			if msg["role"] != "assistant" || msg["content"] != tc.content {
				t.Errorf("message = %v, want content %q", msg, tc.content)
			}
			if r, ok := msg["refusal"]; !ok || r != nil {
				t.Errorf("message.refusal = %v (present %v), want null", r, ok)
			}
			if has(msg, "tool_calls") {
				t.Errorf("message has tool_calls: %v", msg)
			}
			if l, ok := choice["logprobs"]; !ok || l != nil {
				t.Errorf("choice.logprobs = %v (present %v), want null", l, ok)
			}
			if num(t, choice["index"]) != 0 || choice["finish_reason"] != tc.finish {
				t.Errorf("choice = %v, want finish_reason %q", choice, tc.finish)
			}
			checkUsage(t, v["usage"], tc.usage)
		})
	}
}

func TestCompletion(t *testing.T) {
	_, srv := newTestServer(t)
	tests := []struct {
		name   string
		prompt string // raw JSON
		extra  string
		text   string
		finish string
		usage  wantUsage
	}{
		{"string", `"The capital of France is"`, `"max_tokens":2`, "tok0 tok1", "length", wantUsage{5, 2, 0}},
		{"empty string", `""`, `"max_tokens":1`, "tok0", "length", wantUsage{0, 1, 0}},
		{"each string is a prompt, directives from the last", `["a b [[sim:tokens=9]]", "c [[sim:tokens=1]]"]`, "", "tok0", "stop", wantUsage{5, 2, 0}},
		{"token ids", `[1, 2, 3]`, `"max_tokens":1`, "tok0", "length", wantUsage{3, 1, 0}},
		{"each list of token ids is a prompt", `[[1, 2], [3], [4, 5, 6]]`, `"max_tokens":1`, "tok0", "length", wantUsage{6, 3, 0}},
		{"n choices for each prompt", `["a b", "c"]`, `"max_tokens":2,"n":3`, "tok0 tok1", "length", wantUsage{3, 12, 0}},
		{"cached", `"a b c d [[sim:cached=2]] [[sim:tokens=3]]"`, "", "tok0 tok1 tok2", "stop", wantUsage{6, 3, 2}},
		{"max_completion_tokens", `"x"`, `"max_completion_tokens":3`, "tok0 tok1 tok2", "length", wantUsage{1, 3, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"` + gptOSS + `","prompt":` + tc.prompt
			if tc.extra != "" {
				body += "," + tc.extra
			}
			resp := post(t, srv, "/v1/completions", body+"}")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d", resp.StatusCode)
			}
			v := readJSON(t, resp)
			if id := at(t, v, "id").(string); !strings.HasPrefix(id, "cmpl-") {
				t.Errorf("id = %q", id)
			}
			if at(t, v, "object") != "text_completion" || at(t, v, "model") != gptOSS {
				t.Errorf("object/model = %v/%v", v["object"], v["model"])
			}
			choice := at(t, v, "choices", 0).(map[string]any)
			if choice["text"] != tc.text || choice["finish_reason"] != tc.finish {
				t.Errorf("choice = %v, want text %q finish %q", choice, tc.text, tc.finish)
			}
			if l, ok := choice["logprobs"]; !ok || l != nil {
				t.Errorf("logprobs = %v (present %v), want null", l, ok)
			}
			checkUsage(t, v["usage"], tc.usage)
		})
	}
}

// content concatenates the text a stream delivered and returns the finish reason.
func streamText(t *testing.T, s stream, chat bool) (text, finish string) {
	t.Helper()
	for _, c := range s.chunks {
		choices := c["choices"].([]any)
		if len(choices) == 0 {
			continue
		}
		choice := choices[0].(map[string]any)
		if chat {
			if content, ok := choice["delta"].(map[string]any)["content"].(string); ok {
				text += content
			}
		} else {
			text += choice["text"].(string)
		}
		if f, ok := choice["finish_reason"].(string); ok {
			finish = f
		}
	}
	return text, finish
}

func TestStreamChat(t *testing.T) {
	_, srv := newTestServer(t)
	tests := []struct {
		name      string
		body      string
		text      string
		finish    string
		usage     *wantUsage // the final usage chunk; nil when not asked for
		numChunks int        // role + tokens, the last with the finish reason (+ usage)
	}{
		{
			name: "without usage", body: chatBody(qwen, "hi there", `"stream":true,"max_tokens":3`),
			text: "tok0 tok1 tok2", finish: "length", numChunks: 4,
		},
		{
			name: "include_usage", body: chatBody(qwen, "hi there", `"stream":true,"max_tokens":3,"stream_options":{"include_usage":true}`),
			text: "tok0 tok1 tok2", finish: "length", usage: &wantUsage{2, 3, -1}, numChunks: 5,
		},
		{
			name: "include_usage false", body: chatBody(qwen, "hi there", `"stream":true,"max_tokens":3,"stream_options":{"include_usage":false}`),
			text: "tok0 tok1 tok2", finish: "length", numChunks: 4,
		},
		{
			name: "tokens directive", body: chatBody(gptOSS, "hi [[sim:tokens=1]] [[sim:cached=1]]", `"stream":true,"stream_options":{"include_usage":true}`),
			text: "tok0", finish: "stop", usage: &wantUsage{3, 1, 1}, numChunks: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv, "/v1/chat/completions", tc.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d", resp.StatusCode)
			}
			s := readStream(t, resp)
			if !s.done || s.err != nil {
				t.Fatalf("stream done=%v err=%v, want [DONE] and a clean end", s.done, s.err)
			}
			if len(s.chunks) != tc.numChunks {
				t.Fatalf("got %d chunks, want %d: %s", len(s.chunks), tc.numChunks, s.raw)
			}
			id := s.chunks[0]["id"]
			for i, c := range s.chunks {
				if c["id"] != id || c["object"] != "chat.completion.chunk" || (c["model"] != qwen && c["model"] != gptOSS) || num(t, c["created"]) != int(testNow.Unix()) {
					t.Errorf("chunk %d header = %v", i, c)
				}
			}
			if got := string(s.raw[0]); !strings.Contains(got, `"delta":{"role":"assistant","content":""}`) {
				t.Errorf("first chunk = %s, want the assistant role with empty content", got)
			}
			tokens := s.raw[1:len(strings.Fields(tc.text))]
			for i, raw := range tokens {
				if !strings.Contains(string(raw), `"finish_reason":null`) || has(s.chunks[1+i], "usage") {
					t.Errorf("token chunk %d = %s", i, raw)
				}
			}
			last := len(s.chunks) - 1
			if tc.usage != nil {
				if choices := s.chunks[last]["choices"].([]any); len(choices) != 0 {
					t.Errorf("usage chunk choices = %v, want []", choices)
				}
				checkUsage(t, s.chunks[last]["usage"], *tc.usage)
				last--
			}
			if got := string(s.raw[last]); !strings.Contains(got, `"logprobs":null,"finish_reason":"`+tc.finish+`"`) || strings.Contains(got, `"delta":{}`) {
				t.Errorf("last token chunk = %s, want the last token with the finish reason", got)
			}
			text, finish := streamText(t, s, true)
			if text != tc.text || finish != tc.finish {
				t.Errorf("text %q finish %q, want %q %q", text, finish, tc.text, tc.finish)
			}
		})
	}
}

func TestStreamCompletion(t *testing.T) {
	_, srv := newTestServer(t)
	tests := []struct {
		name   string
		body   string
		text   string
		finish string
		usage  *wantUsage
	}{
		{"without usage", completionBody(qwen, "once upon", `"stream":true,"max_tokens":2`), "tok0 tok1", "length", nil},
		{"include_usage", completionBody(qwen, "once upon [[sim:tokens=1]]", `"stream":true,"max_tokens":2,"stream_options":{"include_usage":true}`), "tok0", "stop", &wantUsage{3, 1, -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv, "/v1/completions", tc.body)
			s := readStream(t, resp)
			if !s.done || s.err != nil {
				t.Fatalf("stream done=%v err=%v", s.done, s.err)
			}
			n := len(strings.Fields(tc.text)) - 1 // the last token carries the finish reason
			want := n + 1
			if tc.usage != nil {
				want++
			}
			if len(s.chunks) != want {
				t.Fatalf("got %d chunks, want %d: %s", len(s.chunks), want, s.raw)
			}
			for i, c := range s.chunks[:n] {
				if c["object"] != "text_completion" || !strings.Contains(string(s.raw[i]), `"logprobs":null,"finish_reason":null`) {
					t.Errorf("token chunk %d = %s", i, s.raw[i])
				}
			}
			if got := string(s.raw[n]); !strings.Contains(got, `"logprobs":null,"finish_reason":"`+tc.finish+`"`) || strings.Contains(got, `"text":""`) {
				t.Errorf("last chunk = %s, want the last token with the finish reason", got)
			}
			if tc.usage != nil {
				checkUsage(t, s.chunks[n+1]["usage"], *tc.usage)
			}
			text, finish := streamText(t, s, false)
			if text != tc.text || finish != tc.finish {
				t.Errorf("text %q finish %q, want %q %q", text, finish, tc.text, tc.finish)
			}
		})
	}
}

func TestContinuousUsage(t *testing.T) {
	_, srv := newTestServer(t)
	opts := `"stream":true,"max_tokens":3,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`
	tests := []struct {
		name       string
		path, body string
		completion []int // completion_tokens on each chunk, the final usage chunk included
	}{
		{"chat", "/v1/chat/completions", chatBody(qwen, "two words", opts), []int{0, 1, 2, 3, 3}},
		{"completions", "/v1/completions", completionBody(qwen, "two words", opts), []int{1, 2, 3, 3}},
		{"chat tool call", "/v1/chat/completions", chatBody(qwen, "[[sim:tool_call=get_weather]] x", opts), []int{0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := readStream(t, post(t, srv, tc.path, tc.body))
			if !s.done {
				t.Fatal("no [DONE]")
			}
			if len(s.chunks) != len(tc.completion) {
				t.Fatalf("got %d chunks, want %d: %s", len(s.chunks), len(tc.completion), s.raw)
			}
			for i, c := range s.chunks {
				if !has(c, "usage") {
					t.Fatalf("chunk %d has no usage: %s", i, s.raw[i])
				}
				checkUsage(t, c["usage"], wantUsage{2, tc.completion[i], -1})
			}
		})
	}

	t.Run("needs include_usage", func(t *testing.T) {
		s := readStream(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "hi", `"stream":true,"max_tokens":2,"stream_options":{"continuous_usage_stats":true}`)))
		for i, c := range s.chunks {
			if has(c, "usage") {
				t.Errorf("chunk %d has usage: %s", i, s.raw[i])
			}
		}
	})
}

func TestToolCall(t *testing.T) {
	_, srv := newTestServer(t)
	const args = `{"city": "Paris", "unit": "celsius"}`

	t.Run("non-streaming", func(t *testing.T) {
		v := readJSON(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "weather? [[sim:tool_call=get_weather]]", `"tools":[],"tool_choice":"auto"`)))
		choice := at(t, v, "choices", 0).(map[string]any)
		if choice["finish_reason"] != "tool_calls" {
			t.Errorf("finish_reason = %v", choice["finish_reason"])
		}
		msg := choice["message"].(map[string]any)
		if c, ok := msg["content"]; !ok || c != nil {
			t.Errorf("content = %v (present %v), want null", c, ok)
		}
		call := at(t, msg, "tool_calls", 0).(map[string]any)
		if id := call["id"].(string); !strings.HasPrefix(id, "call_") || call["type"] != "function" {
			t.Errorf("tool call = %v", call)
		}
		if at(t, call, "function", "name") != "get_weather" || at(t, call, "function", "arguments") != args {
			t.Errorf("function = %v", call["function"])
		}
		checkUsage(t, v["usage"], wantUsage{2, 8, -1})
	})

	t.Run("streaming", func(t *testing.T) {
		s := readStream(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "weather? [[sim:tool_call=get_weather]]", `"stream":true,"stream_options":{"include_usage":true}`)))
		if !s.done {
			t.Fatal("no [DONE]")
		}
		// role, header, 8 fragments (the last with the finish reason), usage
		if len(s.chunks) != 11 {
			t.Fatalf("got %d chunks: %s", len(s.chunks), s.raw)
		}
		header := at(t, s.chunks[1], "choices", 0, "delta", "tool_calls", 0).(map[string]any)
		if num(t, header["index"]) != 0 || !strings.HasPrefix(header["id"].(string), "call_") || header["type"] != "function" ||
			at(t, header, "function", "name") != "get_weather" || at(t, header, "function", "arguments") != "" {
			t.Errorf("header chunk = %s", s.raw[1])
		}
		var got string
		for i, c := range s.chunks[2:10] {
			frag := at(t, c, "choices", 0, "delta", "tool_calls", 0).(map[string]any)
			if num(t, frag["index"]) != 0 || has(frag, "id") || has(frag, "type") || has(frag["function"].(map[string]any), "name") {
				t.Errorf("fragment %d = %s", i, s.raw[2+i])
			}
			piece := at(t, frag, "function", "arguments").(string)
			if len(piece) > 5 {
				t.Errorf("fragment %d is %d bytes", i, len(piece))
			}
			got += piece
		}
		if got != args {
			t.Errorf("arguments = %q, want %q", got, args)
		}
		if at(t, s.chunks[9], "choices", 0, "finish_reason") != "tool_calls" {
			t.Errorf("last fragment = %s, want finish_reason tool_calls", s.raw[9])
		}
		checkUsage(t, s.chunks[10]["usage"], wantUsage{2, 8, -1})
	})
}

// TestToolResultAnsweredWithText: after the call the directive asked for, the tool's result (the
// last message, role "tool") is answered with text, streamed or not, so that a client's tool loop
// (the JS SDK's runTools) ends; the directive is still in the user's message.
func TestToolResultAnsweredWithText(t *testing.T) {
	_, srv := newTestServer(t)
	conversation := `{"model":"` + qwen + `","max_tokens":3,"messages":[
		{"role":"user","content":"weather? [[sim:tool_call=get_weather]]"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"sunny"}]`

	v := readJSON(t, post(t, srv, "/v1/chat/completions", conversation+"}"))
	choice := at(t, v, "choices", 0).(map[string]any)
	msg := choice["message"].(map[string]any)
	if choice["finish_reason"] != "length" || msg["content"] != "tok0 tok1 tok2" || len(asSlice(msg["tool_calls"])) != 0 {
		t.Errorf("answer to a tool result = %v, want text", choice)
	}

	s := readStream(t, post(t, srv, "/v1/chat/completions", conversation+`,"stream":true}`))
	var text string
	for i, c := range s.chunks {
		delta := at(t, c, "choices", 0, "delta").(map[string]any)
		if has(delta, "tool_calls") {
			t.Errorf("chunk %d calls a tool: %s", i, s.raw[i])
		}
		if c, ok := delta["content"].(string); ok {
			text += c
		}
	}
	if !s.done || text != "tok0 tok1 tok2" {
		t.Errorf("streamed answer to a tool result: %q (done %v)", text, s.done)
	}

	// The same conversation one step earlier (its last message the user's) still calls the tool.
	v = readJSON(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "weather? [[sim:tool_call=get_weather]]", "")))
	if at(t, v, "choices", 0, "finish_reason") != "tool_calls" {
		t.Errorf("without a tool result: %v", v["choices"])
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func TestDelays(t *testing.T) {
	_, srv := newTestServer(t)
	const step = 30 * time.Millisecond

	t.Run("delay_ms between streamed tokens", func(t *testing.T) {
		// From before the request: the delays may have begun before a loaded machine returned
		// the response's headers to the test.
		start := time.Now()
		resp := post(t, srv, "/v1/chat/completions", chatBody(qwen, "[[sim:delay_ms=30]]", `"stream":true,"max_tokens":3`))
		s := readStream(t, resp)
		if elapsed := time.Since(start); elapsed < 3*step {
			t.Errorf("stream took %v, want at least %v", elapsed, 3*step)
		}
		if text, _ := streamText(t, s, true); text != "tok0 tok1 tok2" {
			t.Errorf("text = %q", text)
		}
	})
	t.Run("delay_ms on a non-streaming answer", func(t *testing.T) {
		start := time.Now()
		resp := post(t, srv, "/v1/completions", completionBody(qwen, "[[sim:delay_ms=30]]", `"max_tokens":4`))
		if elapsed := time.Since(start); elapsed < 4*step {
			t.Errorf("answer took %v, want at least %v", elapsed, 4*step)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("status = %d", resp.StatusCode)
		}
	})
	for _, stream := range []string{"false", "true"} {
		t.Run("first_byte_ms stream="+stream, func(t *testing.T) {
			start := time.Now()
			resp := post(t, srv, "/v1/chat/completions", chatBody(qwen, "[[sim:first_byte_ms=60]]", `"max_tokens":1,"stream":`+stream))
			if elapsed := time.Since(start); elapsed < 2*step {
				t.Errorf("headers after %v, want at least %v", elapsed, 2*step)
			}
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status = %d", resp.StatusCode)
			}
		})
	}
}

func TestIDsAreDistinct(t *testing.T) {
	_, srv := newTestServer(t)
	a := readJSON(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "[[sim:tool_call=f]]", "")))
	b := readJSON(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "[[sim:tool_call=f]]", "")))
	if a["id"] == b["id"] {
		t.Errorf("two answers share id %v", a["id"])
	}
	if at(t, a, "choices", 0, "message", "tool_calls", 0, "id") == at(t, b, "choices", 0, "message", "tool_calls", 0, "id") {
		t.Error("two tool calls share an id")
	}
}
