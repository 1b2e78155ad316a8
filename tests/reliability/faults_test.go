package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/usage"
)

// fakeBackend misbehaves in ways the simulator cannot: it answers every request according to
// the backend model name the gateway forwarded.
func fakeBackend(t *testing.T) string {
	t.Helper()
	chunk := func(w io.Writer, i int) {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string `json:"model"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		sse := func(n int) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			for i := range n {
				chunk(w, i)
			}
			w.(http.Flusher).Flush()
		}
		switch req.Model {
		case "fake/garbage-sse": // chunks, then an event whose data is not JSON
			sse(3)
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}\n\n")
		case "fake/not-sse": // chunks, then lines that are not SSE, then the end without [DONE]
			sse(3)
			io.WriteString(w, "<html>this is not an event stream</html>\n\n\x00\xff\xfe\n\n")
		case "fake/error-event": // chunks, then an error event mid-stream
			sse(2)
			io.WriteString(w, "data: {\"error\":{\"message\":\"CUDA out of memory\",\"type\":\"server_error\"}}\n\n")
		case "fake/huge-event": // chunks, then one event over the decoder's 8 MiB limit
			sse(2)
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"")
			big := strings.Repeat("a", 1<<20)
			for range 9 {
				io.WriteString(w, big)
			}
			io.WriteString(w, "\"}}]}\n\n")
		case "fake/invalid-json": // a non-streamed answer that is not JSON
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","choices":[{"message":{"content":"tok0"`)
		case "fake/huge-body": // a non-streamed answer over the gateway's 64 MiB limit
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`)
			big := strings.Repeat("a", 1<<20)
			for range 65 {
				if _, err := io.WriteString(w, big); err != nil {
					return
				}
			}
			io.WriteString(w, `"},"finish_reason":"stop"}]}`)
		case "fake/html-stream": // a streaming request answered with a page
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, "<html>maintenance</html>")
		default:
			http.Error(w, "unknown fake "+req.Model, 404)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// TestBackendFaults sends requests through a fault proxy and fake backends that refuse, reset,
// stall and send garbage, and checks for each the client's status and body (contract section 3),
// that the slot came back (the organization can fill its limit again), and the usage event and
// ledger debit: the cost of what was delivered, exactly.
func TestBackendFaults(t *testing.T) {
	simURL := startSimulator(t, "sim/plain", "sim/continuous")
	simHost := strings.TrimSuffix(strings.TrimPrefix(simURL, "http://"), "/v1")
	fake := fakeBackend(t)

	proxies := map[string]*faultProxy{}
	proxied := func(id string, f fault) string {
		p := newFaultProxy(t, simHost)
		p.set(f)
		proxies[id] = p
		return p.URL()
	}
	models := []model{
		{ID: "ok", URL: simURL, Backend: "sim/continuous", Continuous: true},
		{ID: "refused", URL: "http://" + freeAddr(t) + "/v1", Backend: "sim/plain"},
		{ID: "proxy-refuse", URL: proxied("proxy-refuse", fault{kind: refuse}), Backend: "sim/plain"},
		{ID: "reset-on-open", URL: proxied("reset-on-open", fault{kind: resetOnOpen}), Backend: "sim/plain"},
		{ID: "reset-in-headers", URL: proxied("reset-in-headers", fault{kind: resetAfter, after: 40}), Backend: "sim/plain"},
		{ID: "stall-headers", URL: proxied("stall-headers", fault{kind: stallHeaders, stall: 8 * time.Second}), Backend: "sim/plain"},
		{ID: "reset-mid", URL: proxied("reset-mid", fault{kind: resetAfter, after: 3000}), Backend: "sim/plain"},
		{ID: "reset-mid-exact", URL: proxied("reset-mid-exact", fault{kind: resetAfter, after: 3000}), Backend: "sim/continuous", Continuous: true},
		{ID: "stall-mid", URL: proxied("stall-mid", fault{kind: stallAfter, after: 3000, stall: 2500 * time.Millisecond}), Backend: "sim/plain"},
		{ID: "drop", URL: simURL, Backend: "sim/plain"},
		{ID: "huge-stream", URL: simURL, Backend: "sim/plain"},
	}
	for _, f := range []string{"garbage-sse", "not-sse", "error-event", "huge-event", "invalid-json", "huge-body", "html-stream"} {
		models = append(models, model{ID: f, URL: fake, Backend: "fake/" + f})
	}
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "data"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const org, limit = "org_faults", 2
	key := newOrg(t, st, org, limit, "100.00")
	gw := startGateway(t,
		"KILN_CATALOG="+writeCatalog(t, models...),
		"KILN_DATA_DIR="+filepath.Join(dir, "data"),
		"KILN_BACKEND_HEADER_TIMEOUT=2s",
		"KILN_BACKEND_CONNECT_TIMEOUT=2s",
		"KILN_KEEPALIVE=1s",
	)

	type expect int
	const (
		badGateway  expect = iota // 502 plain text, nothing billed
		streamError               // 200, then an upstream_stream_error event and no [DONE]
		completed                 // 200 and [DONE]
		badAnswer                 // 502 plain text after the backend answered: at most the prompt billed
	)
	tests := []struct {
		model   string
		content string
		stream  bool
		max     int
		want    expect
		exact   bool          // billed from the backend's usage, not estimated
		within  time.Duration // the answer must end this soon
		tokens  int           // for completed: exact completion tokens
	}{
		{model: "refused", content: "hello there", stream: true, max: 20, want: badGateway, within: 5 * time.Second},
		{model: "proxy-refuse", content: "hello there", stream: false, max: 20, want: badGateway, within: 5 * time.Second},
		{model: "reset-on-open", content: "hello there", stream: true, max: 20, want: badGateway, within: 5 * time.Second},
		{model: "reset-in-headers", content: "hello there", stream: true, max: 20, want: badGateway, within: 5 * time.Second},
		{model: "stall-headers", content: "hello there", stream: true, max: 20, want: badGateway, within: 6 * time.Second},
		{model: "reset-mid", content: "a fairly long prompt of words [[sim:delay_ms=20]]", stream: true, max: 200, want: streamError, within: 10 * time.Second},
		{model: "reset-mid-exact", content: "seven words in this prompt [[sim:delay_ms=20]]", stream: true, max: 200, want: streamError, exact: true, within: 10 * time.Second},
		{model: "stall-mid", content: "stall me [[sim:delay_ms=20]]", stream: true, max: 200, want: streamError, within: 10 * time.Second},
		{model: "drop", content: "drop me [[sim:drop_after=5]]", stream: true, max: 50, want: streamError, within: 10 * time.Second},
		{model: "garbage-sse", content: "garbage please", stream: true, max: 20, want: streamError, within: 5 * time.Second},
		{model: "not-sse", content: "not sse please", stream: true, max: 20, want: streamError, within: 5 * time.Second},
		{model: "error-event", content: "error event please", stream: true, max: 20, want: streamError, within: 5 * time.Second},
		{model: "huge-event", content: "huge event please", stream: true, max: 20, want: streamError, within: 10 * time.Second},
		{model: "invalid-json", content: "invalid json please", stream: false, max: 20, want: badAnswer, within: 5 * time.Second},
		{model: "huge-body", content: "huge body please", stream: false, max: 20, want: badAnswer, within: 20 * time.Second},
		{model: "html-stream", content: "html please", stream: true, max: 20, want: badAnswer, within: 5 * time.Second},
		{model: "huge-stream", content: "a long answer", stream: true, max: 20000, want: completed, exact: true, within: 30 * time.Second, tokens: 20000},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			start := time.Now()
			r := post(ctx, gw.Base, key, "/chat/completions", chatBody(tc.model, tc.content, tc.stream, tc.max))
			took := time.Since(start)
			if r.err != nil {
				t.Fatalf("transport error: %v (status %d)", r.err, r.status)
			}
			if took > tc.within {
				t.Errorf("answered after %v, want within %v", took, tc.within)
			}
			if !strings.HasPrefix(r.genID, "gen-") {
				t.Errorf("no generation id header: %q", r.genID)
			}
			ev := waitEvent(t, st, org, r.genID)
			var want money.Amount
			switch tc.want {
			case badGateway, badAnswer:
				if r.status != 502 || !strings.HasPrefix(r.ctype, "text/plain") || !strings.HasPrefix(string(r.body), "Bad Gateway: ") {
					t.Fatalf("want a plain-text 502, got %d %q %q", r.status, r.ctype, r.body)
				}
				if ev.Status != usage.StatusUpstreamError || ev.HTTPStatus != 502 || ev.CompletionTokens != 0 {
					t.Errorf("event %s %d, completion %d", ev.Status, ev.HTTPStatus, ev.CompletionTokens)
				}
				// An error before the first byte costs nothing, a bad answer from the backend
				// included: want stays zero.
			case streamError:
				if r.status != 200 || r.errCode != "upstream_stream_error" || r.done || r.afterErr {
					t.Fatalf("want 200 ending in one upstream_stream_error event without [DONE]; got %d, error %q, done %v, data after error %v\n%.600s", r.status, r.errCode, r.done, r.afterErr, r.body)
				}
				if r.chunks == 0 {
					t.Fatalf("the fault came before any content: %q", r.body)
				}
				if ev.Status != usage.StatusUpstreamError || ev.HTTPStatus != 200 || ev.CompletionTokens != int64(r.chunks) {
					t.Errorf("event %s %d, completion %d; the client received %d chunks", ev.Status, ev.HTTPStatus, ev.CompletionTokens, r.chunks)
				}
				if tc.exact {
					// Continuous usage: prompt tokens as the backend counted them (words).
					if ev.Estimated || ev.PromptTokens != int64(len(strings.Fields(tc.content))) {
						t.Errorf("exact billing expected: estimated %v, prompt %d", ev.Estimated, ev.PromptTokens)
					}
					want = cost(t, int64(len(strings.Fields(tc.content))), int64(r.chunks))
				} else {
					if !ev.Estimated || ev.PromptTokens != estimatedPrompt(tc.content) {
						t.Errorf("estimated billing expected: estimated %v, prompt %d, want %d", ev.Estimated, ev.PromptTokens, estimatedPrompt(tc.content))
					}
					want = cost(t, estimatedPrompt(tc.content), int64(r.chunks))
				}
				if tc.model == "stall-mid" && !r.keepalive {
					t.Errorf("no keepalive during a 2.5 s stall with KILN_KEEPALIVE=1s")
				}
			case completed:
				if r.status != 200 || !r.done || r.errCode != "" || r.chunks != tc.tokens {
					t.Fatalf("want a complete stream of %d chunks, got %d, done %v, error %q, %d chunks", tc.tokens, r.status, r.done, r.errCode, r.chunks)
				}
				if ev.Status != usage.StatusCompleted || ev.Estimated || ev.CompletionTokens != int64(tc.tokens) {
					t.Errorf("event %s, estimated %v, completion %d", ev.Status, ev.Estimated, ev.CompletionTokens)
				}
				want = cost(t, int64(len(strings.Fields(tc.content))), int64(tc.tokens))
				t.Logf("%d bytes streamed in %v", len(r.body), took)
			}
			checkBilled(t, st, ev, want)
			waitIdle(t, st, org, 10*time.Second)
			fillLimit(t, st, gw.Base, key, org, "ok", limit)
		})
	}

	// The whole ledger: the debits are the events' costs, and the balance is what is left.
	events, err := st.Usage(context.Background(), org, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var sumEvents money.Amount
	for _, e := range events {
		sumEvents += e.Cost
	}
	by, sumDebits := debits(t, st, org)
	for id, d := range by {
		if len(d) != 1 {
			t.Errorf("%s debited %d times", id, len(d))
		}
	}
	o, err := st.Org(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	if sumDebits != -sumEvents || o.Balance != money.Amount(100_000_000_000_000)+sumDebits {
		t.Errorf("ledger: debits %s, events %s, balance %s", sumDebits, sumEvents, o.Balance)
	}
	t.Logf("%d events, %d debits, billed %s in all", len(events), len(by), sumEvents)
}
