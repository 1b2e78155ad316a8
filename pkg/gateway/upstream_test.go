package gateway

import (
	"github.com/neocloud/kiln/pkg/catalog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/upstream"
)

// TestUpstreamOutcomes is the contract's table of what a client gets for each backend outcome.
func TestUpstreamOutcomes(t *testing.T) {
	t.Parallel()
	// Failures would open the breaker after three rows; TestBreakerOnServerErrors covers that.
	forEachServer(t, func(t *testing.T, server catalog.Server) {
		h := newHarness(t, config{server: server, upstream: func(o *upstream.Options) { o.FailureThreshold = 1000 }})
		const (
			chat  = "/v1/chat/completions"
			compl = "/v1/completions"
		)
		tests := []struct {
			name     string
			path     string
			body     string
			status   int
			message  string // the JSON error's message, for 4xx and 503
			code     string // "" means null
			errType  string
			param    string // "" means null
			sglang   string // SGLang's message where it differs (its param is then null)
			textBody bool   // 502: plain text
		}{
			{name: "400 context too long", path: chat, body: chatBody("qwen3-32b", "a b c", `"max_tokens":50000`), status: 400, errType: "invalid_request_error",
				param: "max_tokens", message: "'max_tokens' or 'max_completion_tokens' is too large: 50000. This model's maximum context length is 40960 tokens and your request has 3 input tokens (50000 > 40960 - 3).",
				sglang: "Requested token count exceeds the model's maximum context length of 40960 tokens. You requested a total of 50003 tokens: 3 tokens from the input messages and 50000 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."},
			{name: "400 context too long on completions", path: compl, body: `{"model":"qwen3-32b","prompt":"a b","max_tokens":40960}`, status: 400, errType: "invalid_request_error",
				param: "max_tokens", message: "'max_tokens' or 'max_completion_tokens' is too large: 40960. This model's maximum context length is 40960 tokens and your request has 2 input tokens (40960 > 40960 - 2).",
				sglang: "Requested token count exceeds the model's maximum context length of 40960 tokens. You requested a total of 40962 tokens: 2 tokens from the input messages and 40960 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."},
			{name: "400", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=400]]"), status: 400, errType: "invalid_request_error", message: "Simulated error: Bad Request."},
			{name: "400 streaming is still JSON", path: chat, body: chatBody("qwen3-32b", "x [[sim:status=400]]", `"stream":true`), status: 400, errType: "invalid_request_error", message: "Simulated error: Bad Request."},
			{name: "413", path: compl, body: `{"model":"qwen3-32b","prompt":"x [[sim:status=413]]"}`, status: 400, errType: "invalid_request_error", message: "Simulated error: Request Entity Too Large."},
			{name: "422", path: chat, body: chatBody("qwen3-32b", "x [[sim:status=422]]", `"stream":true`), status: 400, errType: "invalid_request_error", message: "Simulated error: Unprocessable Entity."},
			{name: "501 is the client's 400", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=501]]", `"stream":true`), status: 400, errType: "invalid_request_error", message: "Simulated error: Not Implemented."},
			{name: "backend's own validation", path: chat, body: chatBody("qwen3-32b", "x", `"n":0`), status: 400, errType: "invalid_request_error"},
			{name: "429", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=429]]"), status: 503, errType: "service_unavailable", code: "backend_unavailable"},
			{name: "429 streaming", path: compl, body: `{"model":"gpt-oss-120b","prompt":"x [[sim:status=429]]","stream":true}`, status: 503, errType: "service_unavailable", code: "backend_unavailable"},
			{name: "500", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=500]]"), status: 502, textBody: true},
			{name: "500 streaming", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=500]]", `"stream":true`), status: 502, textBody: true},
			{name: "503", path: compl, body: `{"model":"gpt-oss-120b","prompt":"x [[sim:status=503]]"}`, status: 502, textBody: true},
			{name: "404 misconfigured backend", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=404]]"), status: 502, textBody: true},
			{name: "401 misconfigured backend", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:status=401]]"), status: 502, textBody: true},
			{name: "reset before headers", path: chat, body: chatBody("gpt-oss-120b", "x [[sim:drop_after=0]]"), status: 502, textBody: true},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if server == catalog.ServerSGLang && tc.sglang != "" {
					tc.message, tc.param = tc.sglang, ""
				}
				r := h.do(req{path: tc.path, body: tc.body, key: h.key})
				if r.status != tc.status {
					t.Fatalf("status %d, want %d; body %s", r.status, tc.status, r.body)
				}
				if !genIDPattern.MatchString(r.genID()) {
					t.Errorf("generation id %q", r.genID())
				}
				if tc.textBody {
					if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
						t.Errorf("Content-Type %q, want text/plain", ct)
					}
					if len(r.body) == 0 || r.body[0] == '{' {
						t.Errorf("502 body %q is not plain text", r.body)
					}
				} else {
					e := r.errorBody(t)
					if e.Type != tc.errType {
						t.Errorf("type %s, want %s", e.Type, tc.errType)
					}
					if got := deref(e.Code); (tc.code == "" && e.Code != nil) || (tc.code != "" && got != tc.code) {
						t.Errorf("code %s, want %q", got, tc.code)
					}
					if (tc.param == "" && e.Param != nil) || (tc.param != "" && deref(e.Param) != tc.param) {
						t.Errorf("param %s, want %q", deref(e.Param), tc.param)
					}
					if tc.message != "" && e.Message != tc.message {
						t.Errorf("message %q,\nwant    %q", e.Message, tc.message)
					}
				}
				if r.header.Get("Retry-After") != "" {
					t.Errorf("Retry-After %q outside maintenance", r.header.Get("Retry-After"))
				}
				// A request the backend refused as the request's fault is rejected, like one the
				// gateway refuses itself; everything else is the backend's failure.
				wantStatus := "upstream_error"
				if tc.status == 400 {
					wantStatus = "rejected"
				}
				ev := h.waitEvent(h.orgID, r.genID())
				if ev.HTTPStatus != tc.status || ev.Cost != 0 || string(ev.Status) != wantStatus {
					t.Errorf("event: status %s, http %d, cost %s; want %s", ev.Status, ev.HTTPStatus, ev.Cost, wantStatus)
				}
			})
		}
	})
}

// TestUnreachableBackend checks refused connections (502), then the breaker opening after
// repeated failures (503), and a backend that never sends its headers (502).
func TestUnreachableBackend(t *testing.T) {
	t.Parallel()
	dead := closedURL(t)
	h := newHarness(t,
		config{extraModels: extraModel("dead-model", backendYAML("dead-1", dead, "dead"))},
		config{upstream: func(o *upstream.Options) {
			o.HeaderTimeout = 150 * time.Millisecond
			o.FailureThreshold = 3
			o.OpenFor = time.Minute
		}},
	)
	body := chatBody("dead-model", "hello")
	for i := range 3 {
		r := h.chat(body)
		if r.status != http.StatusBadGateway || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Fatalf("refused connection %d: %d %q %s", i, r.status, r.header.Get("Content-Type"), r.body)
		}
		if ev := h.waitEvent(h.orgID, r.genID()); ev.Status != "upstream_error" || ev.HTTPStatus != 502 || ev.Backend != "dead-1" || ev.Cost != 0 {
			t.Errorf("event %+v", ev)
		}
	}
	r := h.chat(body)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("breaker open: %d %s", r.status, r.body)
	}
	if e := r.errorBody(t); e.Type != "service_unavailable" || deref(e.Code) != "backend_unavailable" {
		t.Errorf("breaker open: %+v", e)
	}
	if r.header.Get("Retry-After") != "" {
		t.Errorf("Retry-After outside maintenance")
	}
	if ev := h.waitEvent(h.orgID, r.genID()); ev.HTTPStatus != 503 || ev.Cost != 0 {
		t.Errorf("event %+v", ev)
	}

	t.Run("no headers before the timeout", func(t *testing.T) {
		start := time.Now()
		r := h.chat(chatBody("qwen3-32b", "x [[sim:first_byte_ms=3000]]", `"stream":true`))
		if r.status != http.StatusBadGateway || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Fatalf("%d %q %s", r.status, r.header.Get("Content-Type"), r.body)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("took %v with a 150 ms header timeout", d)
		}
		if !genIDPattern.MatchString(r.genID()) {
			t.Errorf("generation id %q", r.genID())
		}
		ev := h.waitEvent(h.orgID, r.genID())
		if ev.Status != "upstream_error" || ev.HTTPStatus != 502 {
			t.Errorf("event %+v", ev)
		}
		h.waitIdle(h.orgID) // the simulator saw the request cancelled
	})
}

// TestRetry checks that a request that never reached its first backend is retried on the
// second, and that one which reached a backend is not.
func TestRetry(t *testing.T) {
	t.Parallel()
	// The failing backend reads the request, then closes the connection without an answer.
	failing := &counter{next: func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }}
	failSrv := httptest.NewServer(failing)
	t.Cleanup(failSrv.Close)

	h := newHarness(t,
		config{extraModels: extraModel("retry-model",
			backendYAML("retry-dead", closedURL(t), "openai/gpt-oss-120b"),
			backendYAML("retry-live", "SIM_URL", "openai/gpt-oss-120b"))},
		config{extraModels: extraModel("noretry-model",
			backendYAML("noretry-failing", failSrv.URL+"/v1", "openai/gpt-oss-120b"),
			backendYAML("noretry-live", "SIM_URL", "openai/gpt-oss-120b"))},
		// The breaker stays closed, so that every request can meet the failing backend.
		config{upstream: func(o *upstream.Options) { o.FailureThreshold = 1000 }},
	)

	t.Run("refused is retried", func(t *testing.T) {
		const n = 6
		before := h.rec.count()
		for i := range n {
			r := h.chat(chatBody("retry-model", "retry [[sim:tokens=2]]"))
			if r.status != 200 {
				t.Fatalf("request %d: %d %s", i, r.status, r.body)
			}
			if ev := h.waitEvent(h.orgID, r.genID()); ev.Backend != "retry-live" || ev.Status != "completed" {
				t.Errorf("event backend %s status %s", ev.Backend, ev.Status)
			}
		}
		if got := h.rec.count() - before; got != n {
			t.Errorf("live backend got %d requests, want %d", got, n)
		}
	})

	t.Run("reached is not retried", func(t *testing.T) {
		const n = 6
		before := h.rec.count()
		var ok, bad int
		for range n {
			r := h.chat(chatBody("noretry-model", "noretry [[sim:tokens=2]]"))
			switch r.status {
			case 200:
				ok++
			case 502:
				bad++
				if ev := h.waitEvent(h.orgID, r.genID()); ev.Backend != "noretry-failing" || ev.Cost != 0 {
					t.Errorf("502 event backend %s cost %s", ev.Backend, ev.Cost)
				}
			default:
				t.Fatalf("status %d %s", r.status, r.body)
			}
		}
		live := h.rec.count() - before
		if int(failing.n.Load()) != bad || live != ok {
			t.Errorf("failing backend got %d requests for %d 502s; live got %d for %d successes", failing.n.Load(), bad, live, ok)
		}
		if bad == 0 || ok == 0 {
			t.Errorf("round robin never used both backends: %d ok, %d failed", ok, bad)
		}
	})
}

// TestBreakerOnServerErrors checks contract section 3: six requests of one organization that the
// backend answers with 500 leave the model to every other organization; once a second
// organization draws a 500 too, the model answers 503 without calling the backend.
func TestBreakerOnServerErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t, config{upstream: func(o *upstream.Options) { o.FailureThreshold = 2; o.OpenFor = time.Minute }})
	keyB, _ := h.newOrg("org_b", initialCredits, 8)
	keyC, _ := h.newOrg("org_c", initialCredits, 8)
	for i := range 6 {
		if r := h.chat(chatBody("gpt-oss-120b", "x [[sim:status=500]]")); r.status != 502 {
			t.Fatalf("org_test's 500 #%d: %d", i, r.status)
		}
	}
	if r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "fine [[sim:tokens=1]]"), key: keyB}); r.status != 200 {
		t.Fatalf("org_b after org_test's 500s: %d %s", r.status, r.body)
	}
	// The success closed the run; two organizations' 500s open it.
	if r := h.chat(chatBody("gpt-oss-120b", "x [[sim:status=500]]")); r.status != 502 {
		t.Fatalf("org_test's 500: %d", r.status)
	}
	if r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "x [[sim:status=500]]"), key: keyB}); r.status != 502 {
		t.Fatalf("org_b's 500: %d", r.status)
	}
	before := h.rec.count()
	r := h.do(req{path: "/v1/chat/completions", body: chatBody("gpt-oss-120b", "fine [[sim:tokens=1]]"), key: keyC})
	if r.status != 503 || deref(r.errorBody(t).Code) != "backend_unavailable" {
		t.Fatalf("open breaker: %d %s", r.status, r.body)
	}
	if h.rec.count() != before {
		t.Errorf("the open breaker let a request through")
	}
	// Another model's backend is not affected.
	if r := h.chat(chatBody("qwen3-32b", "fine [[sim:tokens=1]]")); r.status != 200 {
		t.Errorf("other model: %d %s", r.status, r.body)
	}
}
