package lambda

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/usage"
)

const (
	orgID = "org_lambda"
	// settleReserve is KILN_SETTLE_RESERVE for the gateway under test: short, so that the
	// deadline test is quick.
	settleReserve = time.Second
	// longDeadline is the invocation deadline of tests that are not about deadlines.
	longDeadline = 60 * time.Second
)

// gatewayStack is the built gateway bootstrap under the emulated Runtime API, with the embedded
// store (seeded with one organization and key) and the model simulator as its backend.
type gatewayStack struct {
	fn    *function
	store *sqlite.Store
	key   string
	sim   *backend
}

// backend serves the model simulator on loopback and records when each of its responses ended.
type backend struct {
	mu       sync.Mutex
	finished []time.Time
}

func (b *backend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.finished)
}

// finishedAt waits until the n-th backend response (counting from 1) has ended and returns when.
// The simulator's handler returns just after the gateway has read the last byte, so this can be
// a little later than the invocation's end.
func (b *backend) finishedAt(t *testing.T, n int) time.Time {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b.mu.Lock()
		if len(b.finished) >= n {
			at := b.finished[n-1]
			b.mu.Unlock()
			return at
		}
		b.mu.Unlock()
	}
	t.Fatalf("backend response %d never ended", n)
	return time.Time{}
}

func startGateway(t *testing.T) *gatewayStack {
	t.Helper()
	return startGatewayWith(t, nil, nil)
}

// startGatewayWith is startGateway with the backend wrapped by wrap, the catalog edited by
// editCatalog, and env added to the function's environment (any may be nil).
func startGatewayWith(t *testing.T, wrap func(http.Handler) http.Handler, editCatalog func(string) string, env ...string) *gatewayStack {
	t.Helper()
	dir := t.TempDir()

	sim := &backend{}
	var handler http.Handler = simulator.New(simulator.Config{Models: []simulator.Model{
		{Name: "Qwen/Qwen3-32B", ContextLength: 40960, RejectRequiredToolChoice: true},
		{Name: "openai/gpt-oss-120b", ContextLength: 131072},
	}})
	if wrap != nil {
		handler = wrap(handler)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.ServeHTTP(w, r)
		sim.mu.Lock()
		sim.finished = append(sim.finished, time.Now())
		sim.mu.Unlock()
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	cat := strings.ReplaceAll(string(catalog.ReferenceYAML()), "127.0.0.1:8090", ln.Addr().String())
	catalog := filepath.Join(dir, "catalog.yaml")
	if editCatalog != nil {
		cat = editCatalog(cat)
	}
	if err := os.WriteFile(catalog, []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}

	data := filepath.Join(dir, "data")
	st, err := sqlite.Open(data, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	now := time.Now().UTC()
	if err := st.CreateOrg(ctx, store.Org{ID: orgID, Name: "Lambda", Status: store.OrgActive, MaxInFlight: 2, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddEntry(ctx, store.LedgerEntry{ID: "top_lambda", OrgID: orgID, Kind: store.EntryTopUp, Amount: 5 * money.Dollar, Note: "test credits", At: now}); err != nil {
		t.Fatal(err)
	}
	key, id, hash, err := apikey.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(ctx, store.Key{ID: id, OrgID: orgID, Hash: hash, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}

	fn := startFunction(t, "gateway", append([]string{
		// On Lambda KILN_STORE defaults to dynamodb; the embedded store is set explicitly so that
		// these tests need no DynamoDB.
		"KILN_STORE=sqlite",
		"KILN_DATA_DIR=" + data,
		"KILN_CATALOG=" + catalog,
		"KILN_SETTLE_RESERVE=" + settleReserve.String(),
		"KILN_LOG_LEVEL=info",
	}, env...)...)
	return &gatewayStack{fn: fn, store: st, key: key, sim: sim}
}

// request is one HTTP request to the gateway, to be wrapped in an event.
type request struct {
	method, path, query string
	headers             map[string]string
	body                string
	base64              bool
	auth                bool // add the test key's Authorization header
}

// functionURLEvent wraps r in the recorded function URL event of events/.
func functionURLEvent(t *testing.T, r request) []byte {
	t.Helper()
	var ev events.LambdaFunctionURLRequest
	readJSON(t, "function-url-request.json", &ev)
	ev.RawPath, ev.RequestContext.HTTP.Path = r.path, r.path
	ev.RawQueryString = r.query
	ev.RequestContext.HTTP.Method = r.method
	ev.Headers = map[string]string{"content-type": "application/json", "host": ev.RequestContext.DomainName}
	for k, v := range r.headers {
		ev.Headers[strings.ToLower(k)] = v
	}
	ev.Body, ev.IsBase64Encoded = r.body, r.base64
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// restAPIEvent wraps r in the recorded REST API proxy event of events/.
func restAPIEvent(t *testing.T, r request) []byte {
	t.Helper()
	var ev events.APIGatewayProxyRequest
	readJSON(t, "rest-api-request.json", &ev)
	ev.Path, ev.RequestContext.Path = r.path, "/prod"+r.path
	ev.HTTPMethod, ev.RequestContext.HTTPMethod = r.method, r.method
	ev.PathParameters = map[string]string{"proxy": strings.TrimPrefix(r.path, "/")}
	ev.Headers = map[string]string{"Content-Type": "application/json", "Host": ev.RequestContext.DomainName}
	for k, v := range r.headers {
		ev.Headers[k] = v
	}
	ev.MultiValueHeaders = map[string][]string{}
	for k, v := range ev.Headers {
		ev.MultiValueHeaders[k] = []string{v}
	}
	ev.QueryStringParameters, ev.MultiValueQueryStringParameters = nil, nil
	if r.query != "" {
		ev.QueryStringParameters = map[string]string{}
		ev.MultiValueQueryStringParameters = map[string][]string{}
		for _, kv := range strings.Split(r.query, "&") {
			k, v, _ := strings.Cut(kv, "=")
			ev.QueryStringParameters[k] = v
			ev.MultiValueQueryStringParameters[k] = append(ev.MultiValueQueryStringParameters[k], v)
		}
	}
	ev.Body, ev.IsBase64Encoded = r.body, r.base64
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "events", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("events/%s: %v", name, err)
	}
}

func (s *gatewayStack) auth() map[string]string {
	return map[string]string{"Authorization": "Bearer " + s.key}
}

// chat is a chat completion request body.
func chat(model, content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":          model,
		"stream":         stream,
		"messages":       []map[string]string{{"role": "user", "content": content}},
		"max_tokens":     maxTokens,
		"stream_options": map[string]any{"include_usage": true},
	})
	if !stream {
		b, _ = json.Marshal(map[string]any{
			"model":      model,
			"messages":   []map[string]string{{"role": "user", "content": content}},
			"max_tokens": maxTokens,
		})
	}
	return string(b)
}

// checkStreamed checks the framing every gateway answer has: a streamed HTTP integration
// response with a JSON prelude and eight NUL bytes, and no function error.
func checkStreamed(t *testing.T, inv *invocation) *prelude {
	t.Helper()
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.outcome != "response" {
		t.Fatalf("invocation ended with %s %s: %s", inv.outcome, inv.errorType, inv.errorBody)
	}
	if inv.contentType != integrationResponse {
		t.Fatalf("response content type %q, want %q", inv.contentType, integrationResponse)
	}
	if !inv.chunked {
		t.Errorf("response POST not chunked: not streamed")
	}
	if inv.prelude == nil {
		t.Fatalf("no prelude and eight NUL bytes in %q", truncate(inv.raw))
	}
	if inv.prelude.StatusCode <= 0 {
		t.Fatalf("prelude is not the JSON head with a status: %q", truncate(inv.raw))
	}
	if string(inv.delimiter) != string(nulDelimiter) {
		t.Fatalf("delimiter %q, want eight NUL bytes", inv.delimiter)
	}
	if inv.errorType != "" {
		t.Errorf("function error in trailer: %s %s", inv.errorType, inv.errorBody)
	}
	return inv.prelude
}

func header(p *prelude, name string) string {
	for k, v := range p.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	for k, v := range p.MultiValueHeaders {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// TestStreamingChatCompletion sends a streamed chat completion through both event shapes and
// checks that the SSE events reach the Runtime API one by one, while the backend is still
// generating, and that the request is settled.
func TestStreamingChatCompletion(t *testing.T) {
	s := startGateway(t)
	for _, tc := range []struct {
		name  string
		event func(*testing.T, request) []byte
	}{
		{"function URL", functionURLEvent},
		{"REST API", restAPIEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const tokens, delay = 6, 150 * time.Millisecond
			n := s.sim.count() + 1
			inv := s.fn.invoke(t, tc.event(t, request{
				method: "POST", path: "/v1/chat/completions", headers: s.auth(),
				body: chat("gpt-oss-120b", "count slowly [[sim:delay_ms=150]]", tokens, true),
			}), longDeadline)
			p := checkStreamed(t, inv)
			if p.StatusCode != http.StatusOK || !strings.HasPrefix(header(p, "Content-Type"), "text/event-stream") {
				t.Fatalf("prelude %+v, want 200 text/event-stream", p)
			}
			gen := header(p, "X-Neocloud-Generation-Id")
			if !strings.HasPrefix(gen, "gen-") {
				t.Fatalf("X-Neocloud-Generation-Id %q", gen)
			}

			evs := inv.events()
			var content []sseEvent
			var usageChunk map[string]any
			for _, e := range evs {
				var chunk struct {
					Choices []json.RawMessage `json:"choices"`
					Usage   map[string]any    `json:"usage"`
				}
				if e.data == "" || e.data == "[DONE]" || json.Unmarshal([]byte(e.data), &chunk) != nil {
					continue
				}
				if len(chunk.Choices) > 0 {
					content = append(content, e)
				}
				if chunk.Usage != nil {
					usageChunk = chunk.Usage
				}
			}
			if len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", truncate(inv.body))
			}
			if len(content) < tokens {
				t.Fatalf("%d content events, want at least %d: %q", len(content), tokens, truncate(inv.body))
			}
			if usageChunk == nil || usageChunk["cost"] == nil {
				t.Errorf("no usage chunk with cost: %q", truncate(inv.body))
			}

			// Incremental delivery: the first token reached the Runtime API while the backend was
			// still generating the rest, and the tokens arrived spread out as generated.
			backendDone := s.sim.finishedAt(t, n)
			first, last := content[0].at, content[len(content)-1].at
			if lead := backendDone.Sub(first); lead < 3*delay {
				t.Errorf("first token arrived %v before the backend finished, want ≥ %v: buffered", lead, 3*delay)
			}
			if spread := last.Sub(first); spread < time.Duration(tokens-2)*delay {
				t.Errorf("tokens arrived within %v, want spread over ≥ %v: buffered", spread, time.Duration(tokens-2)*delay)
			}

			// Settled before the response ended: slot released, debit and usage recorded.
			ctx := context.Background()
			if leases, err := s.store.InFlight(ctx, orgID, time.Now()); err != nil || len(leases) != 0 {
				t.Errorf("in flight after the response: %v, %v", leases, err)
			}
			ev, err := s.store.Generation(ctx, orgID, gen)
			if err != nil {
				t.Fatalf("generation %s not recorded: %v", gen, err)
			}
			if ev.Status != usage.StatusCompleted || ev.CompletionTokens != tokens || ev.Cost <= 0 {
				t.Errorf("usage event %+v", ev)
			}
		})
	}
}

// TestResponses checks status, headers and body of answers that are not streams, through both
// event shapes: errors keep their status and JSON (or the plain text of a 502).
func TestResponses(t *testing.T) {
	s := startGateway(t)
	unknownModel := chat("not-a-model", "hi", 4, true)
	for _, tc := range []struct {
		name        string
		req         request
		status      int
		contentType string
		code        string // error code; "-" for an error whose code is null
	}{
		{"no key", request{method: "POST", path: "/v1/chat/completions", body: chat("qwen3-32b", "hi", 4, true)}, 401, "application/json", "invalid_api_key"},
		{"unknown model", request{method: "POST", path: "/v1/chat/completions", auth: true, body: unknownModel}, 404, "application/json", "model_not_found"},
		{"empty messages", request{method: "POST", path: "/v1/chat/completions", auth: true, body: `{"model":"qwen3-32b","messages":[],"stream":true}`}, 400, "application/json", "empty_array"},
		{"backend 400 on a stream", request{method: "POST", path: "/v1/chat/completions", auth: true, body: chat("qwen3-32b", "[[sim:status=400]]", 4, true)}, 400, "application/json", "-"},
		{"backend 500", request{method: "POST", path: "/v1/chat/completions", auth: true, body: chat("qwen3-32b", "[[sim:status=500]]", 4, true)}, 502, "text/plain", ""},
		{"not streamed", request{method: "POST", path: "/v1/chat/completions", auth: true, body: chat("gpt-oss-120b", "hi", 4, false)}, 200, "application/json", ""},
		{"base64 body", request{method: "POST", path: "/v1/completions", auth: true, base64: true, body: base64.StdEncoding.EncodeToString([]byte(`{"model":"qwen3-32b","prompt":"hi","max_tokens":3}`))}, 200, "application/json", ""},
		{"models", request{method: "GET", path: "/v1/models", auth: true}, 200, "application/json", ""},
		{"credits", request{method: "GET", path: "/v1/credits", auth: true}, 200, "application/json", ""},
		{"unknown path", request{method: "GET", path: "/nope", auth: true}, 404, "application/json", "unknown_url"},
	} {
		for _, shape := range []struct {
			name  string
			event func(*testing.T, request) []byte
		}{{"function URL", functionURLEvent}, {"REST API", restAPIEvent}} {
			t.Run(shape.name+"/"+tc.name, func(t *testing.T) {
				r := tc.req
				if r.auth {
					r.headers = s.auth()
				}
				inv := s.fn.invoke(t, shape.event(t, r), longDeadline)
				p := checkStreamed(t, inv)
				if p.StatusCode != tc.status {
					t.Fatalf("status %d, want %d: %s", p.StatusCode, tc.status, truncate(inv.body))
				}
				if ct := header(p, "Content-Type"); !strings.HasPrefix(ct, tc.contentType) {
					t.Errorf("content type %q, want %s", ct, tc.contentType)
				}
				if tc.contentType != "application/json" {
					return
				}
				var body struct {
					Error *struct {
						Message string  `json:"message"`
						Type    string  `json:"type"`
						Code    *string `json:"code"`
					} `json:"error"`
				}
				if err := json.Unmarshal(inv.body, &body); err != nil {
					t.Fatalf("body is not JSON: %v: %q", err, truncate(inv.body))
				}
				switch {
				case tc.code == "" && body.Error != nil:
					t.Errorf("unexpected error %+v", *body.Error)
				case tc.code == "-" && (body.Error == nil || body.Error.Code != nil || body.Error.Message == ""):
					t.Errorf("want an error with code null, got %s", truncate(inv.body))
				case tc.code != "" && tc.code != "-" && (body.Error == nil || body.Error.Code == nil || *body.Error.Code != tc.code):
					t.Errorf("want error code %s, got %s", tc.code, truncate(inv.body))
				}
			})
		}
	}

	t.Run("generation by query string", func(t *testing.T) {
		inv := s.fn.invoke(t, functionURLEvent(t, request{method: "POST", path: "/v1/chat/completions", headers: s.auth(), body: chat("qwen3-32b", "hi", 3, false)}), longDeadline)
		gen := header(checkStreamed(t, inv), "X-Neocloud-Generation-Id")
		for _, shape := range []func(*testing.T, request) []byte{functionURLEvent, restAPIEvent} {
			inv := s.fn.invoke(t, shape(t, request{method: "GET", path: "/v1/generation", query: "id=" + gen, headers: s.auth()}), longDeadline)
			p := checkStreamed(t, inv)
			if p.StatusCode != 200 || !strings.Contains(string(inv.body), gen) {
				t.Errorf("GET /v1/generation?id=%s: %d %s", gen, p.StatusCode, truncate(inv.body))
			}
		}
	})

	t.Run("unknown event", func(t *testing.T) {
		inv := s.fn.invoke(t, []byte(`{"Records":[]}`), longDeadline)
		if inv.outcome != "error" || inv.errorType == "" {
			t.Fatalf("outcome %s %q, want an /error", inv.outcome, inv.errorType)
		}
		// The process serves the next invocation after a failed one.
		inv = s.fn.invoke(t, functionURLEvent(t, request{method: "GET", path: "/healthz"}), longDeadline)
		if p := checkStreamed(t, inv); p.StatusCode != 200 {
			t.Errorf("healthz after a failed invocation: %d", p.StatusCode)
		}
	})
}

// TestDeadline gives an invocation less time than its stream needs: the gateway ends the stream
// KILN_SETTLE_RESERVE before the deadline with a final error event, the response completes
// before the deadline, and the request is settled — slot released, what was generated debited.
func TestDeadline(t *testing.T) {
	s := startGateway(t)
	const deadline = 3 * time.Second
	start := time.Now()
	inv := s.fn.invoke(t, functionURLEvent(t, request{
		method: "POST", path: "/v1/chat/completions", headers: s.auth(),
		body: chat("gpt-oss-120b", "a long answer [[sim:delay_ms=200]]", 100, true),
	}), deadline)
	p := checkStreamed(t, inv)
	if p.StatusCode != 200 {
		t.Fatalf("status %d", p.StatusCode)
	}
	if took := inv.finishedAt.Sub(start); took > deadline-settleReserve/2 || took < deadline-settleReserve-time.Second {
		t.Errorf("response ended after %v; want about %v (deadline %v minus reserve %v)", took, deadline-settleReserve, deadline, settleReserve)
	}
	evs := inv.events()
	if len(evs) < 3 {
		t.Fatalf("too few events before the cut: %q", truncate(inv.body))
	}
	last := evs[len(evs)-1].data
	var final struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(last), &final) != nil || final.Error.Code != "deadline_exceeded" {
		t.Fatalf("last event %q, want an error event with code deadline_exceeded", last)
	}
	if strings.Contains(string(inv.body), "[DONE]") {
		t.Error("a cut stream must not end with [DONE]")
	}

	ctx := context.Background()
	gen := header(p, "X-Neocloud-Generation-Id")
	if leases, err := s.store.InFlight(ctx, orgID, time.Now()); err != nil || len(leases) != 0 {
		t.Errorf("slot still held after the cut: %v, %v", leases, err)
	}
	ev, err := s.store.Generation(ctx, orgID, gen)
	if err != nil {
		t.Fatalf("cut request not settled: %v", err)
	}
	if ev.CompletionTokens <= 0 || ev.Cost <= 0 || ev.Status != usage.StatusDeadlineExceeded {
		t.Errorf("usage of the cut request: %+v", ev)
	}
	ledger, err := s.store.Ledger(ctx, orgID)
	if err != nil {
		t.Fatal(err)
	}
	debited := false
	for _, e := range ledger {
		if e.ID == gen && e.Kind == store.EntryDebit && e.Amount == -ev.Cost {
			debited = true
		}
	}
	if !debited {
		t.Errorf("no debit of %s for %s in the ledger: %+v", ev.Cost, gen, ledger)
	}
}

// TestDeadlineShorterThanReserve: an invocation whose deadline is shorter than the settle reserve
// is answered at once with a clear 503 deadline_exceeded (contract section 6), never a 502 that
// blames a backend the gateway did not call; it is recorded with that status.
func TestDeadlineShorterThanReserve(t *testing.T) {
	s := startGateway(t)
	inv := s.fn.invoke(t, functionURLEvent(t, request{
		method: "POST", path: "/v1/chat/completions", headers: s.auth(),
		body: chat("qwen3-32b", "hello", 5, false),
	}), settleReserve/2)
	p := checkStreamed(t, inv)
	if p.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(inv.body), `"code":"deadline_exceeded"`) {
		t.Fatalf("status %d, body %s: want 503 deadline_exceeded", p.StatusCode, truncate(inv.body))
	}
	if n := s.sim.count(); n != 0 {
		t.Errorf("the backend was called %d times", n)
	}
	ev, err := s.store.Generation(context.Background(), orgID, header(p, "X-Neocloud-Generation-Id"))
	if err != nil || ev.Status != usage.StatusDeadlineExceeded || ev.HTTPStatus != http.StatusServiceUnavailable {
		t.Errorf("usage event %+v (%v): want status deadline_exceeded, http_status 503", ev, err)
	}
}
