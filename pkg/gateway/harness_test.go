package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/upstream"
	"github.com/neocloud/kiln/pkg/usage"
)

// The test harness runs everything over real sockets: the model simulator behind an
// httptest.Server (wrapped by a recorder that keeps what the gateway forwarded), the real SQLite
// store in a temporary directory, and the gateway behind its own httptest.Server.

// catalogYAML is infra/catalog.yaml with the backends pointed at the test's simulator, except
// that qwen3-32b's backend does not report cached tokens, so that a stream cut on a backend with
// continuous usage can be billed exactly (one that reports them is not: see
// TestCutStreamBilling). %[1]s is
// the simulator's base URL (ending in /v1), %[2]s extra models appended to the list, %[3]s the
// server both reference backends run (the simulator speaks it).
const catalogYAML = `version: 1
models:
  - id: qwen3-32b
    owned_by: neocloud
    created: 1754000000
    context_length: 40960
    input_modalities: [text]
    parallel_tool_calls: false
    forced_tool_choice: false
    ignore_eos: true
    pricing:
      input: "0.06"
      cached_input: "0.03"
      output: "0.24"
    backends:
      - name: qwen3-32b-sim-1
        url: %[1]s
        model: Qwen/Qwen3-32B
        server: %[3]s
        continuous_usage: true

  - id: gpt-oss-120b
    owned_by: neocloud
    created: 1754000000
    context_length: 131072
    input_modalities: [text]
    parallel_tool_calls: true
    forced_tool_choice: true
    ignore_eos: false
    pricing:
      input: "0.035"
      cached_input: "0.0175"
      output: "0.07"
    backends:
      - name: gpt-oss-120b-sim-1
        url: %[1]s
        model: openai/gpt-oss-120b
        server: %[3]s
        continuous_usage: false
        cached_tokens: true
%[2]s`

// extraModel renders one more catalog model (text only, gpt-oss prices) with the given backends.
func extraModel(id string, backends ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
  - id: %s
    owned_by: test
    created: 1754000000
    context_length: 4096
    input_modalities: [text]
    parallel_tool_calls: false
    forced_tool_choice: true
    ignore_eos: true
    pricing:
      input: "0.035"
      cached_input: "0.0175"
      output: "0.07"
    backends:
`, id)
	for _, be := range backends {
		b.WriteString(be)
	}
	return b.String()
}

// backendYAML renders one backend entry for extraModel.
func backendYAML(name, url, model string) string {
	return fmt.Sprintf("      - name: %s\n        url: %s\n        model: %s\n", name, url, model)
}

// closedURL returns a base URL on which nothing listens: connections are refused.
func closedURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/v1"
}

// forwarded is one request as a backend received it.
type forwarded struct {
	Path   string
	Header http.Header
	Body   []byte
}

// recorder wraps a backend handler and keeps every inference request it receives, with the
// response body it sent for non-streaming answers.
type recorder struct {
	next http.Handler
	off  atomic.Bool // benchmarks: pass requests through without keeping them

	mu        sync.Mutex
	requests  []forwarded
	responses [][]byte
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rec.off.Load() {
		rec.next.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec.mu.Lock()
	rec.requests = append(rec.requests, forwarded{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	rec.mu.Unlock()
	tw := &teeWriter{ResponseWriter: w}
	rec.next.ServeHTTP(tw, r)
	rec.mu.Lock()
	rec.responses = append(rec.responses, tw.buf.Bytes())
	rec.mu.Unlock()
}

func (rec *recorder) count() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.requests)
}

// find returns the forwarded request whose body contains marker, and the response sent to it.
func (rec *recorder) find(t testing.TB, marker string) (forwarded, []byte) {
	t.Helper()
	// The response is recorded after the handler returns, which can be a moment after the
	// client saw it.
	deadline := time.Now().Add(3 * time.Second)
	for {
		rec.mu.Lock()
		var (
			found forwarded
			resp  []byte
			n     int
		)
		for i, f := range rec.requests {
			if bytes.Contains(f.Body, []byte(marker)) {
				found, n = f, n+1
				if i < len(rec.responses) {
					resp = rec.responses[i]
				} else {
					resp = nil
				}
			}
		}
		rec.mu.Unlock()
		if n > 1 {
			t.Fatalf("marker %q reached the backend %d times", marker, n)
		}
		if n == 1 && resp != nil {
			return found, resp
		}
		if time.Now().After(deadline) {
			if n == 1 {
				return found, nil
			}
			t.Fatalf("no forwarded request contains %q", marker)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// teeWriter keeps a copy of what the backend wrote and still flushes at once.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.buf.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// servers are the model servers the behaviour suites run against.
var servers = []catalog.Server{catalog.ServerVLLM, catalog.ServerSGLang}

// forEachServer runs test once per model server, in parallel: a table over servers, so that
// every behaviour the test checks holds against vLLM and against SGLang.
func forEachServer(t *testing.T, test func(t *testing.T, server catalog.Server)) {
	t.Helper()
	for _, sv := range servers {
		t.Run(string(sv), func(t *testing.T) {
			t.Parallel()
			test(t, sv)
		})
	}
}

// config changes a harness before it starts.
type config struct {
	server      catalog.Server // the reference backends' server; vLLM when empty
	extraModels string
	gateway     func(*Options)
	upstream    func(*upstream.Options)
	wrapStore   func(store.Gateway) store.Gateway // what the gateway sees of the store
}

// harness is one gateway with its simulator, store and organizations.
type harness struct {
	t       testing.TB
	server  catalog.Server // what the simulator speaks
	sim     *simulator.Server
	rec     *recorder
	simURL  string // the backends' base URL, ending in /v1
	store   *sqlite.Store
	catalog *catalog.Catalog
	gw      *Gateway
	srv     *httptest.Server
	base    string // where requests go: srv.URL unless a test puts something in front
	client  *http.Client

	orgID string // the default organization
	key   string // its key
	keyID string
}

// initialCredits is what the default organization starts with.
const initialCredits = "10"

func newHarness(t testing.TB, cfgs ...config) *harness {
	t.Helper()
	var cfg config
	for _, c := range cfgs {
		if c.extraModels != "" {
			cfg.extraModels += c.extraModels
		}
		if c.gateway != nil {
			cfg.gateway = c.gateway
		}
		if c.upstream != nil {
			cfg.upstream = c.upstream
		}
		if c.wrapStore != nil {
			cfg.wrapStore = c.wrapStore
		}
		if c.server != "" {
			cfg.server = c.server
		}
	}
	if cfg.server == "" {
		cfg.server = catalog.ServerVLLM
	}
	h := &harness{t: t, server: cfg.server}
	sw := simulator.Software(cfg.server)
	h.sim = simulator.New(simulator.Config{Server: sw, Models: []simulator.Model{
		{Name: "Qwen/Qwen3-32B", ContextLength: 40960, RejectRequiredToolChoice: true, Server: sw},
		{Name: "openai/gpt-oss-120b", ContextLength: 131072, Server: sw, CachedTokens: true},
	}})
	h.rec = &recorder{next: h.sim}
	simSrv := httptest.NewServer(h.rec)
	t.Cleanup(simSrv.Close)
	h.simURL = simSrv.URL + "/v1"

	extra := strings.ReplaceAll(cfg.extraModels, "SIM_URL", h.simURL)
	cat, err := catalog.Parse([]byte(fmt.Sprintf(catalogYAML, h.simURL, extra, cfg.server)))
	if err != nil {
		t.Fatalf("catalog: %v", err)
	}
	h.catalog = cat

	st, err := sqlite.Open(t.TempDir(), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h.store = st

	uopt := upstream.Options{}
	if cfg.upstream != nil {
		cfg.upstream(&uopt)
	}
	opt := Options{
		Store:    st,
		Catalog:  cat,
		Upstream: upstream.New(cat, uopt),
		// Revocations, suspensions and maintenance take effect on the next request.
		CacheTTL: time.Nanosecond,
		// Far above what SQLite takes, so that a loaded machine does not turn an answer into a
		// 503 store_unavailable (the default 2 s was passed under -race at load average 19);
		// the tests of the deadline set their own.
		AdmitTimeout: 30 * time.Second,
	}
	if cfg.wrapStore != nil {
		opt.Store = cfg.wrapStore(opt.Store)
	}
	if cfg.gateway != nil {
		cfg.gateway(&opt)
	}
	h.gw, err = New(opt)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(h.gw)
	h.base = h.srv.URL
	// Registered after the store's cleanup, so it runs first: open streams end and settle
	// before the store closes.
	t.Cleanup(h.srv.Close)
	h.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	t.Cleanup(h.client.CloseIdleConnections)

	h.orgID = "org_test"
	h.key, h.keyID = h.newOrg(h.orgID, initialCredits, store.DefaultMaxInFlight)
	return h
}

// newOrg creates an active organization with credits (none when "0") and one key.
func (h *harness) newOrg(id, credits string, maxInFlight int) (key, keyID string) {
	h.t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	if err := h.store.CreateOrg(ctx, store.Org{ID: id, Name: id, Status: store.OrgActive, MaxInFlight: maxInFlight, CreatedAt: now}); err != nil {
		h.t.Fatal(err)
	}
	if credits != "0" {
		amount, err := money.Parse(credits)
		if err != nil {
			h.t.Fatal(err)
		}
		if err := h.store.AddEntry(ctx, store.LedgerEntry{ID: "top_" + id, OrgID: id, Kind: store.EntryTopUp, Amount: amount, At: now}); err != nil {
			h.t.Fatal(err)
		}
	}
	return h.newKey(id)
}

func (h *harness) newKey(orgID string) (key, keyID string) {
	h.t.Helper()
	key, keyID, hash, err := apikey.New()
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.store.CreateKey(context.Background(), store.Key{ID: keyID, OrgID: orgID, Hash: hash, CreatedAt: time.Now().UTC()}); err != nil {
		h.t.Fatal(err)
	}
	return key, keyID
}

// reply is a whole response read from the wire.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) genID() string { return r.header.Get(GenerationHeader) }

// apiErr is the error body of a gateway error.
type apiErr struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// errorBody decodes the OpenAI error shape, failing the test when the body is not exactly that.
func (r reply) errorBody(t testing.TB) apiErr {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q, want application/json (status %d, body %s)", ct, r.status, r.body)
	}
	var env struct {
		Error *apiErr `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil || env.Error == nil {
		t.Fatalf("error body %s: %v", r.body, err)
	}
	if env.Error.Message == "" {
		t.Fatalf("error body %s has no message", r.body)
	}
	return *env.Error
}

// req is a request to send to the gateway.
type req struct {
	method  string // POST when empty
	path    string
	body    string
	key     string // "" sends no Authorization header
	header  http.Header
	chunked bool // send the body without Content-Length
}

func (h *harness) newRequest(ctx context.Context, rq req) *http.Request {
	h.t.Helper()
	method := rq.method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader
	if rq.body != "" || method == http.MethodPost {
		body = strings.NewReader(rq.body)
		if rq.chunked {
			body = io.MultiReader(body) // unknown length: sent chunked
		}
	}
	r, err := http.NewRequestWithContext(ctx, method, h.base+rq.path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	if rq.key != "" {
		r.Header.Set("Authorization", "Bearer "+rq.key)
	}
	for k, vs := range rq.header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return r
}

// do sends rq and reads the whole response.
func (h *harness) do(rq req) reply {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := h.client.Do(h.newRequest(ctx, rq))
	if err != nil {
		h.t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: reading body: %v", rq.method, rq.path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}
}

// chat posts a chat completion with the default key.
func (h *harness) chat(body string) reply {
	h.t.Helper()
	return h.do(req{path: "/v1/chat/completions", body: body, key: h.key})
}

// chatBody is a chat request with one user message.
func chatBody(model, content string, extra ...string) string {
	b, _ := json.Marshal(content)
	s := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(b) + `}]`
	for _, e := range extra {
		s += "," + e
	}
	return s + "}"
}

// sse is a streamed response being read event by event from the wire.
type sse struct {
	t      testing.TB
	resp   *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
	start  time.Time
}

// event is one server-sent event: its data, or a comment.
type event struct {
	data    string
	comment string
	at      time.Duration // since the request was sent
}

// stream sends rq and returns the response without reading its body.
func (h *harness) stream(rq req) *sse {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	start := time.Now()
	resp, err := h.client.Do(h.newRequest(ctx, rq))
	if err != nil {
		cancel()
		h.t.Fatalf("POST %s: %v", rq.path, err)
	}
	s := &sse{t: h.t, resp: resp, r: bufio.NewReader(resp.Body), cancel: cancel, start: start}
	h.t.Cleanup(s.close)
	return s
}

// next reads the next event or comment block; io.EOF at the end of the stream.
func (s *sse) next() (event, error) {
	var ev event
	var data []string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if line == "" && len(data) == 0 && ev.comment == "" {
				return ev, err
			}
			if err != io.EOF {
				return ev, err
			}
			return ev, fmt.Errorf("stream ended inside an event: %q", line)
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if len(data) == 0 && ev.comment == "" {
				continue
			}
			ev.data = strings.Join(data, "\n")
			ev.at = time.Since(s.start)
			return ev, nil
		case strings.HasPrefix(line, ":"):
			ev.comment = line
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		default:
			s.t.Errorf("unexpected SSE line %q", line)
		}
	}
}

// all reads the rest of the stream.
func (s *sse) all() []event {
	s.t.Helper()
	var evs []event
	for {
		ev, err := s.next()
		if err == io.EOF {
			return evs
		}
		if err != nil {
			s.t.Fatalf("reading stream: %v (after %d events)", err, len(evs))
		}
		evs = append(evs, ev)
	}
}

// close leaves: the connection closes, as a client that goes away does.
func (s *sse) close() {
	s.cancel()
	s.resp.Body.Close()
}

// dataEvents keeps the data events, dropping comments.
func dataEvents(evs []event) []event {
	var out []event
	for _, ev := range evs {
		if ev.comment == "" {
			out = append(out, ev)
		}
	}
	return out
}

// chunk is the part of a stream chunk the tests read.
type chunk struct {
	Model   string          `json:"model"`
	Choices []chunkChoice   `json:"choices"`
	Usage   json.RawMessage `json:"usage"`
	Error   *apiErr         `json:"error"`
}

type chunkChoice struct {
	Text  *string `json:"text"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

func parseChunk(t testing.TB, data string) chunk {
	t.Helper()
	var c chunk
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		t.Fatalf("chunk %s: %v", data, err)
	}
	return c
}

// hasContent reports whether a chunk carries generated text.
func (c chunk) hasContent() bool {
	for _, ch := range c.Choices {
		if ch.Text != nil && *ch.Text != "" {
			return true
		}
		if ch.Delta != nil && ch.Delta.Content != nil && *ch.Delta.Content != "" {
			return true
		}
	}
	return false
}

// waitEvent waits for the usage event of genID: settlement runs after the response ended.
func (h *harness) waitEvent(orgID, genID string) usage.Event {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ev, err := h.store.Generation(context.Background(), orgID, genID)
		if err == nil {
			return ev
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("no usage event for %s: %v", genID, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// events lists every recorded event of an organization.
func (h *harness) events(orgID string) []usage.Event {
	h.t.Helper()
	evs, err := h.store.Usage(context.Background(), orgID, time.Unix(0, 0), time.Now().Add(time.Hour))
	if err != nil {
		h.t.Fatal(err)
	}
	return evs
}

// balance returns an organization's balance.
func (h *harness) balance(orgID string) money.Amount {
	h.t.Helper()
	org, err := h.store.Org(context.Background(), orgID)
	if err != nil {
		h.t.Fatal(err)
	}
	return org.Balance
}

// waitIdle waits until the simulator serves nothing and the organization holds no slot.
func (h *harness) waitIdle(orgID string) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		leases, err := h.store.InFlight(context.Background(), orgID, time.Now())
		if err != nil {
			h.t.Fatal(err)
		}
		if h.sim.Active() == 0 && len(leases) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("not idle: simulator active %d, %d leases held", h.sim.Active(), len(leases))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mustCost is the exact cost of a request at a catalog model's prices.
func (h *harness) mustCost(model string, prompt, cached, completion int64) money.Amount {
	h.t.Helper()
	m, ok := h.catalog.Model(model)
	if !ok {
		h.t.Fatalf("no model %s", model)
	}
	c, err := m.Pricing.Cost(prompt, cached, completion)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

var genIDPattern = regexp.MustCompile(`^gen-[0-9A-HJKMNP-TV-Z]{26}$`)

// counter is a backend that counts requests and answers with a handler.
type counter struct {
	n    atomic.Int64
	next http.HandlerFunc
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	c.next(w, r)
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return *s
}

// gatedBackend is a simulator serving the model "gated/model" whose streams pause after their
// first chunk until open is closed, so that a test, not the machine's load, decides when a stream
// ends. Its base URL ends in /v1.
type gatedBackend struct {
	URL  string
	open chan struct{}
}

func newGatedBackend(t testing.TB) *gatedBackend {
	t.Helper()
	sim := simulator.New(simulator.Config{Models: []simulator.Model{{Name: "gated/model", ContextLength: 4096}}})
	g := &gatedBackend{open: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sim.ServeHTTP(&gatedWriter{ResponseWriter: w, open: g.open, done: r.Context().Done()}, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(g.release) // registered last, so it runs first: no stream is left waiting
	g.URL = srv.URL + "/v1"
	return g
}

// release lets every stream, paused or still to come, run to its end.
func (g *gatedBackend) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// model renders the catalog entry "gated" served by the backend, for config.extraModels.
func (g *gatedBackend) model() string {
	return extraModel("gated", backendYAML("gated-1", g.URL, "gated/model"))
}

// gatedWriter holds every write after the first flush until open is closed or the request ends.
type gatedWriter struct {
	http.ResponseWriter
	open, done <-chan struct{}
	flushed    bool
}

func (w *gatedWriter) Write(b []byte) (int, error) {
	if w.flushed {
		select {
		case <-w.open:
		case <-w.done:
			return 0, net.ErrClosed
		}
	}
	return w.ResponseWriter.Write(b)
}

func (w *gatedWriter) FlushError() error {
	w.flushed = true
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *gatedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
