package simulator

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestDropAfter(t *testing.T) {
	sim, srv := newTestServer(t)
	tests := []struct {
		name   string
		path   string
		body   string
		chunks int // JSON chunks received before the cut
	}{
		{"chat after 2 tokens", "/v1/chat/completions", chatBody(qwen, "[[sim:drop_after=2]]", `"stream":true,"max_tokens":5,"stream_options":{"include_usage":true}`), 3},
		{"chat after 0 tokens", "/v1/chat/completions", chatBody(qwen, "[[sim:drop_after=0]]", `"stream":true`), 1},
		{"chat drop_after beyond the answer", "/v1/chat/completions", chatBody(qwen, "[[sim:drop_after=9]]", `"stream":true,"max_tokens":2`), 3},
		{"n=2 after 3 chunks", "/v1/chat/completions", chatBody(qwen, "[[sim:drop_after=3]]", `"stream":true,"max_tokens":4,"n":2`), 5},
		{"completions after 1 token", "/v1/completions", completionBody(qwen, "[[sim:drop_after=1]]", `"stream":true`), 1},
		{"tool call after 3 fragments", "/v1/chat/completions", chatBody(qwen, "[[sim:tool_call=f]] [[sim:drop_after=3]]", `"stream":true`), 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := readStream(t, post(t, srv, tc.path, tc.body))
			if s.done {
				t.Error("stream ended with [DONE]")
			}
			if !errors.Is(s.err, io.ErrUnexpectedEOF) {
				t.Errorf("read ended with %v, want an unexpected EOF", s.err)
			}
			if len(s.chunks) != tc.chunks {
				t.Errorf("got %d chunks before the cut, want %d: %s", len(s.chunks), tc.chunks, s.raw)
			}
			for i, c := range s.chunks {
				choices := c["choices"].([]any)
				if len(choices) == 0 || (at(t, choices, 0, "finish_reason") != nil && !strings.Contains(tc.name, "beyond")) {
					t.Errorf("chunk %d is a final chunk: %s", i, s.raw[i])
				}
			}
		})
	}

	t.Run("non-streaming", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(qwen, "[[sim:drop_after=0]]", "")))
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("got a response with status %d, want a cut connection", resp.StatusCode)
		}
	})
	waitFor(t, "Active to drop to 0", func() bool { return sim.Active() == 0 })
}

func TestDisconnectCancelsGeneration(t *testing.T) {
	// Each request would take 20 s if the disconnect went unnoticed.
	tests := []struct {
		name, path, body string
	}{
		{"while streaming", "/v1/chat/completions", chatBody(gptOSS, "[[sim:delay_ms=20]]", `"stream":true,"max_tokens":1000`)},
		{"while a non-streaming answer is delayed", "/v1/chat/completions", chatBody(gptOSS, "[[sim:delay_ms=20]]", `"max_tokens":1000`)},
		{"while waiting for the first byte", "/v1/completions", completionBody(gptOSS, "[[sim:first_byte_ms=20000]]", "")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim, srv := newTestServer(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() {
				defer close(done)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
				resp, err := srv.Client().Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
			}()
			waitFor(t, "the request to start", func() bool { return sim.Active() == 1 })
			// Leave mid-answer: a streaming client has received a few tokens by then.
			time.Sleep(60 * time.Millisecond)
			start := time.Now()
			cancel()
			waitFor(t, "Active to drop to 0", func() bool { return sim.Active() == 0 })
			if elapsed := time.Since(start); elapsed > 2*time.Second {
				t.Errorf("generation stopped %v after the disconnect", elapsed)
			}
			<-done
			if got := sim.Requests(); got != 1 {
				t.Errorf("Requests = %d, want 1", got)
			}
		})
	}
}

func TestRequestsCount(t *testing.T) {
	sim, srv := newTestServer(t)
	post(t, srv, "/v1/chat/completions", chatBody(qwen, "hi", `"max_tokens":1`))
	post(t, srv, "/v1/completions", `{"model":"nope","prompt":"x"}`)
	post(t, srv, "/v1/completions", `not json`)
	resp, err := srv.Client().Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := sim.Requests(); got != 3 {
		t.Errorf("Requests = %d, want 3", got)
	}
	if got := sim.Active(); got != 0 {
		t.Errorf("Active = %d, want 0", got)
	}
}
