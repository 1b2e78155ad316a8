package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/usage"
)

// TestAnswerNamingAnotherRequestIsNotDelivered: a backend answer that echoes another request's
// X-Request-Id (another organization's answer, sent late) reaches no one: the request that met
// it gets the plain-text 502 of a failed backend and is not billed, and the next request is
// answered in full.
func TestAnswerNamingAnotherRequestIsNotDelivered(t *testing.T) {
	sim := simulator.New(simulator.Config{Models: []simulator.Model{{Name: "echo/model", ContextLength: 4096}}})
	wrongOnce := make(chan struct{}, 1)
	wrongOnce <- struct{}{}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-wrongOnce:
			r.Header.Set("X-Request-Id", "kiln-"+strings.Repeat("A", 26)) // the simulator echoes it
		default:
		}
		sim.ServeHTTP(w, r)
	}))
	defer backend.Close()
	h := newHarness(t, config{extraModels: extraModel("echo", backendYAML("echo-1", backend.URL+"/v1", "echo/model"))})
	before := h.balance(h.orgID)
	r := h.chat(chatBody("echo", "hello", `"max_tokens":3`))
	if r.status != http.StatusBadGateway || r.header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("status %d %q, body %q; want the plain-text 502", r.status, r.header.Get("Content-Type"), r.body)
	}
	if ev := h.waitEvent(h.orgID, r.genID()); ev.Status != usage.StatusUpstreamError || ev.Cost != 0 {
		t.Errorf("event %+v; want upstream_error, free", ev)
	}
	h.waitIdle(h.orgID)
	if got := h.balance(h.orgID); got != before {
		t.Errorf("balance %s, want %s: the refused answer was billed", got, before)
	}
	if r := h.chat(chatBody("echo", "hello", `"max_tokens":3`)); r.status != 200 {
		t.Fatalf("the next request: status %d, body %q", r.status, r.body)
	}
}
