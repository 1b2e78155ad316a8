package simulator

import (
	"net/http"
	"strings"
	"testing"
)

// TestProfiles runs what differs between the two servers over both: per-chunk usage (one choice
// at a time, never cached tokens), cached tokens only with the cache-report flag, how a stream
// ends, where reasoning goes, and errors inside a stream.
func TestProfiles(t *testing.T) {
	for _, sw := range []Software{VLLM, SGLang} {
		t.Run(string(sw), func(t *testing.T) {
			_, srv := newTestServer(t, sw)
			sglang := sw == SGLang

			t.Run("continuous usage counts one choice of one prompt at a time", func(t *testing.T) {
				// vLLM on completions, with two prompts; SGLang's completions stream carries no
				// running usage at all, so it is read on chat, where both choices share the prompt.
				path := "/v1/completions"
				body := `{"model":"` + gptOSS + `","prompt":["a b", "c d [[sim:cached=1]]"],"n":2,"max_tokens":2,"stream":true,` +
					`"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`
				prompts, total := [2]int{2, 3}, 5
				if sglang {
					path = "/v1/chat/completions"
					body = chatBody(gptOSS, "a b [[sim:cached=1]]", `"n":4,"max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`)
					prompts, total = [2]int{3, 3}, 3
				}
				s := readStream(t, post(t, srv, path, body))
				if !s.done {
					t.Fatalf("no [DONE]: %s", s.raw)
				}
				perChoice := map[int]int{} // choice index → completion tokens last reported
				var final map[string]any
				for i, c := range s.chunks {
					choices := c["choices"].([]any)
					if len(choices) == 0 {
						final = c["usage"].(map[string]any)
						continue
					}
					index := num(t, at(t, choices, 0, "index"))
					u, ok := c["usage"].(map[string]any)
					if !ok {
						if sglang && (at(t, choices, 0, "finish_reason") != nil || at(t, choices, 0, "delta", "role") != nil) {
							continue // SGLang's role and finish chunks carry "usage": null
						}
						t.Fatalf("chunk %d has no usage: %s", i, s.raw[i])
					}
					if d, ok := u["prompt_tokens_details"]; ok && d != nil {
						t.Errorf("chunk %d reports cached tokens: %s", i, s.raw[i])
					}
					wantPrompt := prompts[0]
					if index >= 2 {
						wantPrompt = prompts[1] // on completions, choices 2 and 3 answer the second prompt
					}
					if num(t, u["prompt_tokens"]) != wantPrompt {
						t.Errorf("chunk %d (choice %d) prompt_tokens %v, want %d", i, index, u["prompt_tokens"], wantPrompt)
					}
					perChoice[index] = num(t, u["completion_tokens"])
				}
				if len(perChoice) != 4 {
					t.Errorf("choices seen %v, want 4", perChoice)
				}
				for i, n := range perChoice {
					if n != 2 {
						t.Errorf("choice %d reported %d completion tokens last, want 2", i, n)
					}
				}
				checkUsage(t, final, wantUsage{prompt: total, completion: 8, cached: 1})
				if sglang {
					s := readStream(t, post(t, srv, "/v1/completions", completionBody(gptOSS, "a b", `"max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`)))
					for i, c := range s.chunks[:len(s.chunks)-1] {
						if u := c["usage"]; u != nil {
							t.Errorf("SGLang completions chunk %d carries usage: %s", i, s.raw[i])
						}
					}
				}
			})

			t.Run("cached tokens only with the flag", func(t *testing.T) {
				for _, tc := range []struct {
					model  string
					text   string
					cached int // -1: absent
				}{
					{qwen, "a b [[sim:cached=2]]", -1}, // no cache-report flag
					{gptOSS, "a b [[sim:cached=2]]", 2},
					{gptOSS, "a b", map[bool]int{false: 0, true: -1}[sglang]}, // SGLang omits zero
				} {
					v := readJSON(t, post(t, srv, "/v1/chat/completions", chatBody(tc.model, tc.text, `"max_tokens":1`)))
					checkUsage(t, v["usage"], wantUsage{prompt: 3 - map[bool]int{true: 1}[tc.text == "a b"], completion: 1, cached: tc.cached})
				}
			})

			t.Run("how a stream ends", func(t *testing.T) {
				s := readStream(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "hi", `"max_tokens":2,"stream":true`)))
				if !s.done {
					t.Fatal("no [DONE]")
				}
				last := s.chunks[len(s.chunks)-1]
				finish := at(t, last, "choices", 0, "finish_reason")
				content := at(t, last, "choices", 0, "delta", "content")
				if sglang {
					// A chunk of its own after the last token, its delta all nulls.
					if len(s.chunks) != 4 || finish != "length" || content != nil {
						t.Errorf("chunks %s, want role, 2 tokens and a separate finish chunk", s.raw)
					}
				} else if len(s.chunks) != 3 || finish != "length" || content != " tok1" {
					t.Errorf("chunks %s, want role and 2 tokens, the last with the finish reason", s.raw)
				}
			})

			t.Run("reasoning", func(t *testing.T) {
				field, other := "reasoning", "reasoning_content"
				if sglang {
					field, other = other, field
				}
				v := readJSON(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "think [[sim:reasoning=2]]", `"max_tokens":4`)))
				msg := at(t, v, "choices", 0, "message").(map[string]any)
				if msg[field] != "think0 think1" || msg["content"] != "tok0 tok1" || has(msg, other) {
					t.Errorf("message %v, want %s \"think0 think1\" and content \"tok0 tok1\"", msg, field)
				}
				checkUsage(t, v["usage"], wantUsage{prompt: 2, completion: 4, cached: -1})
				s := readStream(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "think [[sim:reasoning=2]]", `"max_tokens":3,"stream":true`)))
				var reasoning, content string
				for _, c := range s.chunks {
					d := at(t, c, "choices", 0, "delta").(map[string]any)
					if r, ok := d[field].(string); ok {
						reasoning += r
					}
					if r, ok := d["content"].(string); ok {
						content += r
					}
					if r, ok := d[other]; ok && r != nil {
						t.Errorf("delta %v carries %s", d, other)
					}
				}
				if reasoning != "think0 think1" || content != "tok0" {
					t.Errorf("streamed %s %q and content %q", field, reasoning, content)
				}
			})

			t.Run("an error inside the stream", func(t *testing.T) {
				resp := post(t, srv, "/v1/chat/completions", chatBody(qwen, "x [[sim:stream_error=400]]", `"stream":true`))
				s := readStream(t, resp)
				if resp.StatusCode != http.StatusOK || !s.done || len(s.chunks) != 1 {
					t.Fatalf("status %d, stream %s (done %v), want 200, one error event and [DONE]", resp.StatusCode, s.raw, s.done)
				}
				// Written by Python's json.dumps: ", " and ": " between members.
				if !strings.HasPrefix(string(s.raw[0]), `{"error": {`) {
					t.Errorf("event %s", s.raw[0])
				}
				checkStreamError(t, sw, s.chunks[0], 400, "BadRequestError", "Simulated error: Bad Request.", "")

				s = readStream(t, post(t, srv, "/v1/chat/completions", chatBody(qwen, "x [[sim:stream_error=500]] [[sim:tokens=2]]", `"stream":true`)))
				if !s.done || len(s.chunks) != 4 || !has(s.chunks[3], "error") {
					t.Fatalf("stream %s, want role, 2 tokens, the error event and [DONE]", s.raw)
				}
				for _, c := range s.chunks[:3] {
					if f := at(t, c, "choices", 0, "finish_reason"); f != nil {
						t.Errorf("chunk %v has a finish reason before the error", c)
					}
				}
				checkStreamError(t, sw, s.chunks[3], 500, "InternalServerError", "Simulated error", "")

				checkError(t, sw, post(t, srv, "/v1/chat/completions", chatBody(qwen, "x [[sim:stream_error=422]]", "")), 422, "UnprocessableEntityError", "Simulated", "")
			})

			t.Run("vLLM's validators repeat the request", func(t *testing.T) {
				body := chatBody(qwen, "my prompt", `"top_logprobs":5,"stream":true,"stream_options":{"include_usage":true}`)
				resp := post(t, srv, "/v1/chat/completions", body)
				if sglang {
					if resp.StatusCode != http.StatusOK {
						t.Errorf("SGLang refused top_logprobs without logprobs: %d", resp.StatusCode)
					}
					return
				}
				want := "[{'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)', " +
					"'input': {'model': 'Qwen/Qwen3-32B', 'messages': [{'role': 'user', 'content': 'my prompt'}], 'top_logprobs': 5, 'stream': True, 'stream_options': {'include_usage': True}}, " +
					"'ctx': {'error': VLLMValidationError('when using `top_logprobs`, `logprobs` must be set to true.')}}]"
				v := readJSON(t, resp)
				if got := at(t, v, "error", "message"); resp.StatusCode != 400 || got != want {
					t.Errorf("status %d, message\n%s\nwant\n%s", resp.StatusCode, got, want)
				}
				if got := post(t, srv, "/v1/chat/completions", chatBody(qwen, "x", `"top_logprobs":5,"logprobs":true`)); got.StatusCode != 200 {
					t.Errorf("top_logprobs with logprobs: %d", got.StatusCode)
				}
			})

			t.Run("vLLM's engine checks logprobs", func(t *testing.T) {
				body := chatBody(qwen, "hi", `"logprobs":true,"top_logprobs":25,"stream":true`)
				resp := post(t, srv, "/v1/chat/completions", body)
				if sglang {
					if resp.StatusCode != http.StatusOK || !readStream(t, resp).done {
						t.Errorf("SGLang refused top_logprobs 25: %d", resp.StatusCode)
					}
					return
				}
				s := readStream(t, resp)
				if !s.done || len(s.chunks) != 1 {
					t.Fatalf("stream %s", s.raw)
				}
				const msg = "Requested sample logprobs of 25, which is greater than max allowed: 20"
				checkStreamError(t, sw, s.chunks[0], 400, "BadRequestError", msg, "logprobs")
				checkError(t, sw, post(t, srv, "/v1/completions", completionBody(qwen, "hi", `"logprobs":21`)), 400, "BadRequestError", "Requested sample logprobs of 21", "logprobs")
			})
		})
	}
}

// checkStreamError asserts an error event: the server's error object inside {"error": ...}.
func checkStreamError(t *testing.T, sw Software, event map[string]any, status int, typ, message, param string) {
	t.Helper()
	if sw == SGLang {
		event = event["error"].(map[string]any)
	}
	checkErrorObject(t, sw, event, status, typ, message, param)
}
