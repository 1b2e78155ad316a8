package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/openai"
)

// scripted is a backend that streams a fixed list of SSE data payloads.
func scripted(t *testing.T, events ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, e := range events {
			fmt.Fprintf(w, "data: %s\n\n", e)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// TestUsageFromAnyChunk checks that usage is read from whichever chunk carries it, counted once,
// and given to the client in a usage chunk of its own when it asked for one.
func TestUsageFromAnyChunk(t *testing.T) {
	t.Parallel()
	const c = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m-backend","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]%s}`
	usageOnLast := scripted(t,
		fmt.Sprintf(c, "Hel", "null", ""),
		fmt.Sprintf(c, "lo", `"stop"`, `,"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}`),
		"[DONE]")
	cumulative := scripted(t,
		fmt.Sprintf(c, "Hel", "null", `,"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}`),
		fmt.Sprintf(c, "lo", `"stop"`, `,"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}`),
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m-backend","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`,
		"[DONE]")
	errorEvent := scripted(t,
		fmt.Sprintf(c, "Hel", "null", ""),
		`{"error":{"message":"boom","type":"InternalServerError","code":500}}`)
	h := newHarness(t, config{extraModels: extraModel("usage-last", backendYAML("usage-last-1", usageOnLast, "m-backend")) +
		extraModel("usage-cumulative", backendYAML("usage-cumulative-1", cumulative, "m-backend")) +
		extraModel("error-event", backendYAML("error-event-1", errorEvent, "m-backend"))})

	tests := []struct {
		model        string
		includeUsage bool
		usageChunks  int
		status       string
	}{
		{"usage-last", true, 1, "completed"},
		{"usage-last", false, 0, "completed"},
		{"usage-cumulative", true, 1, "completed"},
		{"usage-cumulative", false, 0, "completed"},
		{"error-event", true, 0, "upstream_error"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s include_usage %v", tc.model, tc.includeUsage), func(t *testing.T) {
			extra := []string{`"stream":true`}
			if tc.includeUsage {
				extra = append(extra, `"stream_options":{"include_usage":true}`)
			}
			s := h.stream(req{path: "/v1/chat/completions", key: h.key, body: chatBody(tc.model, "hi", extra...)})
			genID := s.resp.Header.Get(GenerationHeader)
			evs := dataEvents(s.all())
			usageChunks := 0
			for _, ev := range evs {
				if ev.data == "[DONE]" {
					continue
				}
				ch := parseChunk(t, ev.data)
				if ch.Error != nil {
					continue
				}
				if ch.Model != tc.model {
					t.Errorf("model %q", ch.Model)
				}
				if len(ch.Choices) == 0 {
					usageChunks++
					if !strings.Contains(ev.data, `"prompt_tokens":9,"completion_tokens":12`) || !strings.HasSuffix(ev.data, `"cost":0.000001155}}`) {
						t.Errorf("usage chunk %s", ev.data)
					}
				} else if strings.Contains(ev.data, `"usage"`) {
					t.Errorf("content chunk with usage: %s", ev.data)
				}
			}
			if usageChunks != tc.usageChunks {
				t.Errorf("%d usage chunks, want %d", usageChunks, tc.usageChunks)
			}
			last := evs[len(evs)-1].data
			ev := h.waitEvent(h.orgID, genID)
			if string(ev.Status) != tc.status {
				t.Errorf("status %s, want %s", ev.Status, tc.status)
			}
			if tc.status == "completed" {
				if last != "[DONE]" {
					t.Errorf("last event %s", last)
				}
				if ev.PromptTokens != 9 || ev.CompletionTokens != 12 || ev.Cost.String() != "0.000001155" || ev.Estimated {
					t.Errorf("event %+v", ev)
				}
			} else if ch := parseChunk(t, last); ch.Error == nil || deref(ch.Error.Code) != "upstream_stream_error" {
				t.Errorf("last event %s", last)
			}
		})
	}
}

// TestDeadline checks that with a request deadline (Lambda) a stream is cut early enough to
// settle: an error event, no [DONE], the delivered part billed, the slot released, and the
// handler done before the deadline. The reserve is most of the deadline, so that settling in it
// holds on a loaded machine, and the cut still comes after the backend has streamed a while.
func TestDeadline(t *testing.T) {
	t.Parallel()
	const deadline, reserve = 2500 * time.Millisecond, 2 * time.Second // the cut at 500 ms
	h := newHarness(t, config{gateway: func(o *Options) { o.SettleReserve = reserve }})
	// Serve through a handler that gives each request a deadline, as the Lambda adapter does,
	// and says whether the gateway was done with the request before it.
	late := make(chan time.Duration, 1)
	withDeadline := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), deadline)
		defer cancel()
		dl, _ := ctx.Deadline()
		h.gw.ServeHTTP(w, r.WithContext(ctx))
		late <- time.Since(dl)
	}))
	t.Cleanup(withDeadline.Close)
	h.base = withDeadline.URL

	s := h.stream(req{path: "/v1/chat/completions", key: h.key,
		body: chatBody("qwen3-32b", "long [[sim:delay_ms=20]]", `"max_tokens":500`, `"stream":true`)})
	genID := s.resp.Header.Get(GenerationHeader)
	evs := dataEvents(s.all())
	if d := <-late; d >= 0 {
		t.Errorf("the gateway was done with the request %v after its deadline, not within the reserve before it", d)
	}
	last := parseChunk(t, evs[len(evs)-1].data)
	if last.Error == nil || deref(last.Error.Code) != "deadline_exceeded" {
		t.Fatalf("last event %s", evs[len(evs)-1].data)
	}
	delivered := 0
	for _, ev := range evs {
		if ev.data == "[DONE]" {
			t.Errorf("[DONE] in a cut stream")
		} else if parseChunk(t, ev.data).hasContent() {
			delivered++
		}
	}
	// How many tokens fit before the deadline depends on the machine's load; what was
	// delivered is billed, exactly (continuous usage may report one more than was relayed).
	ev := h.waitEvent(h.orgID, genID)
	if delivered == 0 || ev.CompletionTokens < int64(delivered) || ev.CompletionTokens > int64(delivered)+1 || ev.Cost <= 0 || ev.Estimated {
		t.Errorf("event %+v for %d content chunks delivered", ev, delivered)
	}
	h.waitIdle(h.orgID)
}

// TestLargeBodyDroppedOnceUsageIsKnown: a stream keeps a large request body only until the
// backend reports the prompt's tokens, which then stand in for the estimate the body was kept
// for; a small body is kept to the end.
func TestLargeBodyDroppedOnceUsageIsKnown(t *testing.T) {
	h := newHarness(t)
	qwen, _ := h.catalog.Model("qwen3-32b")
	noUsage := []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-32B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
	withUsage := []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-32B","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":null}],"usage":{"prompt_tokens":5012,"total_tokens":5013,"completion_tokens":1}}`)
	for _, tc := range []struct {
		name    string
		content int
		dropped bool
	}{
		{"large", 20000, true},
		{"small", 200, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"model":"qwen3-32b","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", tc.content) + `"}]}`)
			x := &exchange{g: h.gw, ep: chatEndpoint, req: &request{model: qwen, stream: true, body: body}}
			x.meter.promptEstimate = func() int64 { return estimatePromptTokens(true, x.req.body) }
			r := &relayState{x: x, rename: true, modelJSON: []byte(`"qwen3-32b"`)}
			if _, err := r.chunk(noUsage); err != nil || x.req.body == nil {
				t.Fatalf("before any usage: %v; body kept: %v", err, x.req.body != nil)
			}
			if _, err := r.chunk(withUsage); err != nil {
				t.Fatal(err)
			}
			if dropped := x.req.body == nil; dropped != tc.dropped {
				t.Errorf("body dropped after usage: %v, want %v", dropped, tc.dropped)
			}
			want := int64(5012)
			if !tc.dropped {
				want = estimatePromptTokens(true, body)
			}
			if got := x.meter.promptEstimate(); got != want {
				t.Errorf("prompt estimate %d, want %d", got, want)
			}
		})
	}
}

// waitingBody is a backend's stream that hands out one event per read and records, at each read,
// whether the relay r holds chunk buffers while it waits for the backend.
type waitingBody struct {
	events []string
	r      *relayState
	held   []bool
}

func (b *waitingBody) Read(p []byte) (int, error) {
	b.held = append(b.held, b.r.buf != nil)
	if len(b.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, "data: "+b.events[0]+"\n\n")
	b.events = b.events[1:]
	return n, nil
}

// TestRelayWaitsWithoutChunkBuffers checks that a stream waiting for its backend's next event
// holds no chunk buffers: an open, idle stream costs none of them.
func TestRelayWaitsWithoutChunkBuffers(t *testing.T) {
	h := newHarness(t)
	qwen, _ := h.catalog.Model("qwen3-32b")
	const c = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-32B","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}`
	x := &exchange{g: h.gw, ep: chatEndpoint, req: &request{model: qwen, stream: true}}
	body := &waitingBody{events: []string{fmt.Sprintf(c, "Hel"), fmt.Sprintf(c, "lo"), "[DONE]"}}
	r := &relayState{x: x, dec: openai.NewDecoder(body), rename: true, modelJSON: []byte(`"qwen3-32b"`)}
	body.r = r
	rec := httptest.NewRecorder()
	s := newStream(rec, systemClock{}, time.Minute)
	defer s.close()
	r.pump(s)
	if !r.done || r.err != nil {
		t.Fatalf("relay ended with done %v, err %v", r.done, r.err)
	}
	if got := strings.Count(rec.Body.String(), `"qwen3-32b"`); got != 2 {
		t.Fatalf("client got %d chunks, want 2:\n%s", got, rec.Body.String())
	}
	for i, held := range body.held {
		if held {
			t.Errorf("read %d of the backend's stream: the relay held chunk buffers while waiting", i+1)
		}
	}
}
