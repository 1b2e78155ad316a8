package gateway

import (
	"context"
	"github.com/neocloud/kiln/pkg/catalog"
	"testing"
	"time"
)

// TestClientDisconnect checks section 6: a client that leaves mid-stream cancels the backend
// request at once, frees its slot, and is billed for what was delivered — exactly on a backend
// with continuous usage, estimated on the other.
func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		path      string
		body      string
		model     string
		estimated bool
		prompt    int64 // the prompt tokens billed: reported, or estimated
	}{
		{name: "continuous usage", path: "/v1/chat/completions", model: "qwen3-32b",
			body: chatBody("qwen3-32b", "leave now [[sim:delay_ms=40]]", `"max_tokens":200`, `"stream":true`), prompt: 3},
		{name: "continuous usage, completions", path: "/v1/completions", model: "qwen3-32b",
			body: `{"model":"qwen3-32b","prompt":"leave [[sim:delay_ms=40]]","max_tokens":200,"stream":true,"stream_options":{"include_usage":true}}`, prompt: 2},
		{name: "no continuous usage", path: "/v1/chat/completions", model: "gpt-oss-120b",
			body: chatBody("gpt-oss-120b", "leave now [[sim:delay_ms=40]]", `"max_tokens":200`, `"stream":true`), estimated: true,
			prompt: 3}, // the estimate: one token per word, the simulator's count
	}
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, config{server: server})
				const limit = 2
				key, _ := h.newOrg("org_leaving", "1", limit)
				before := h.balance("org_leaving")

				s := h.stream(req{path: tc.path, body: tc.body, key: key})
				if s.resp.StatusCode != 200 {
					t.Fatalf("status %d", s.resp.StatusCode)
				}
				genID := s.resp.Header.Get(GenerationHeader)
				const read = 3
				content := 0
				for content < read {
					ev, err := s.next()
					if err != nil {
						t.Fatalf("after %d chunks: %v", content, err)
					}
					if ev.comment == "" && parseChunk(t, ev.data).hasContent() {
						content++
					}
				}
				if h.sim.Active() != 1 {
					t.Fatalf("simulator serves %d requests mid-stream, want 1", h.sim.Active())
				}
				left := time.Now()
				s.close()

				// The backend request ends promptly: well before the 8 s the answer would take.
				for h.sim.Active() != 0 {
					if time.Since(left) > time.Second {
						t.Fatalf("backend still serving %v after the client left", time.Since(left))
					}
					time.Sleep(2 * time.Millisecond)
				}

				// SGLang's completions stream carries no running usage.
				estimated := tc.estimated || (server == catalog.ServerSGLang && tc.path == "/v1/completions")
				ev := h.waitEvent("org_leaving", genID)
				if ev.Status != "client_disconnected" || ev.Estimated != estimated || ev.CompletionTokens < read || ev.Cost <= 0 {
					t.Errorf("event %+v", ev)
				}
				// The backend produced a token every 40 ms; the event cannot count much more than
				// what was sent before the cancellation arrived.
				if ev.CompletionTokens > read+10 {
					t.Errorf("%d completion tokens billed for %d delivered", ev.CompletionTokens, read)
				}
				if tc.prompt != 0 && ev.PromptTokens != tc.prompt {
					t.Errorf("prompt tokens %d, want %d", ev.PromptTokens, tc.prompt)
				}
				if estimated && ev.PromptTokens <= 0 {
					t.Errorf("estimated prompt tokens %d", ev.PromptTokens)
				}
				if want := h.mustCost(tc.model, ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens); ev.Cost != want {
					t.Errorf("cost %s, want %s", ev.Cost, want)
				}
				if got := h.balance("org_leaving"); before-got != ev.Cost {
					t.Errorf("balance fell by %s, want %s", before-got, ev.Cost)
				}

				// The slot is free: the organization can again run its whole limit at once.
				h.waitIdle("org_leaving")
				var open []*sse
				for i := range limit {
					s := h.stream(req{path: "/v1/chat/completions", key: key,
						body: chatBody("qwen3-32b", "again [[sim:delay_ms=30]]", `"max_tokens":20`, `"stream":true`)})
					if s.resp.StatusCode != 200 {
						t.Errorf("stream %d after the disconnect: %d", i, s.resp.StatusCode)
					}
					open = append(open, s)
				}
				for _, s := range open {
					s.close()
				}
			})
		}
	})
}

// TestDisconnectBeforeHeaders checks a client that leaves while the gateway still waits for the
// backend's headers: the backend request is cancelled and the slot freed.
func TestDisconnectBeforeHeaders(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctxDone := make(chan struct{})
	go func() {
		defer close(ctxDone)
		ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
		defer cancel()
		r := h.newRequest(ctx, req{path: "/v1/chat/completions", key: h.key,
			body: chatBody("gpt-oss-120b", "wait [[sim:first_byte_ms=5000]]")})
		resp, err := h.client.Do(r)
		if err == nil {
			resp.Body.Close()
			t.Errorf("got a response: %d", resp.StatusCode)
		}
	}()
	<-ctxDone
	start := time.Now()
	for h.sim.Active() != 0 {
		if time.Since(start) > time.Second {
			t.Fatalf("backend still serving after the client left")
		}
		time.Sleep(2 * time.Millisecond)
	}
	h.waitIdle(h.orgID)
	evs := h.events(h.orgID)
	if len(evs) != 1 || evs[0].Status != "client_disconnected" || evs[0].CompletionTokens != 0 {
		t.Errorf("events %+v", evs)
	}
}
