package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/usage"
)

// withDeadline serves the harness's gateway through a handler that gives each request a deadline,
// as the Lambda adapter does.
func withDeadline(t *testing.T, h *harness, d time.Duration) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.gw.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)
	h.base = srv.URL
}

// TestDeadlineStatuses: the function's deadline, less the settle reserve, is the gateway's limit
// (contract section 6). A deadline shorter than the reserve is a clear 503 deadline_exceeded and no
// backend is called; a backend that has not answered when the limit comes is a 503
// deadline_exceeded too, not a 502 that blames it; a stream cut by the limit ends with a
// deadline_exceeded event. Each usage event has status deadline_exceeded.
func TestDeadlineStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		body     string
		called   bool
		message  string
	}{
		{"deadline shorter than the reserve", 100 * time.Millisecond, chatBody("qwen3-32b", "hello", `"max_tokens":5`), false, "shorter than its settle reserve"},
		{"backend slower than the limit", 500 * time.Millisecond, chatBody("qwen3-32b", "slow [[sim:first_byte_ms=2000]]", `"max_tokens":5`), true, "did not answer within the gateway's time limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, config{gateway: func(o *Options) { o.SettleReserve = 200 * time.Millisecond }})
			withDeadline(t, h, tc.deadline)
			before := h.rec.count()
			r := h.chat(tc.body)
			if r.status != http.StatusServiceUnavailable || r.genID() == "" {
				t.Fatalf("status %d, generation %q: want 503 with the generation id", r.status, r.genID())
			}
			e := r.errorBody(t)
			if e.Code == nil || *e.Code != "deadline_exceeded" || e.Type != "service_unavailable" || !strings.Contains(e.Message, tc.message) {
				t.Errorf("error %+v, want code deadline_exceeded saying %q", e, tc.message)
			}
			if called := h.rec.count() > before; called != tc.called {
				t.Errorf("backend called: %v, want %v", called, tc.called)
			}
			ev := h.waitEvent(h.orgID, r.genID())
			if ev.Status != usage.StatusDeadlineExceeded || ev.HTTPStatus != http.StatusServiceUnavailable {
				t.Errorf("usage event status %s, http_status %d; want deadline_exceeded, 503", ev.Status, ev.HTTPStatus)
			}
			h.waitIdle(h.orgID)
		})
	}
	t.Run("stream cut by the limit", func(t *testing.T) {
		h := newHarness(t, config{gateway: func(o *Options) { o.SettleReserve = 200 * time.Millisecond }})
		withDeadline(t, h, 500*time.Millisecond)
		s := h.stream(req{path: "/v1/chat/completions", key: h.key,
			body: chatBody("qwen3-32b", "long [[sim:delay_ms=20]]", `"max_tokens":500`, `"stream":true`)})
		evs := dataEvents(s.all())
		if last := parseChunk(t, evs[len(evs)-1].data); last.Error == nil || deref(last.Error.Code) != "deadline_exceeded" {
			t.Fatalf("last event %s", evs[len(evs)-1].data)
		}
		ev := h.waitEvent(h.orgID, s.resp.Header.Get(GenerationHeader))
		if ev.Status != usage.StatusDeadlineExceeded || ev.CompletionTokens <= 0 || ev.Cost <= 0 {
			t.Errorf("usage event %+v: want status deadline_exceeded with what was generated billed", ev)
		}
		h.waitIdle(h.orgID)
	})
}
