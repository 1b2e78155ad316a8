// Package reliability runs the built gateway binary under faults, load and hostile clients, over
// real sockets on loopback: a TCP fault proxy and fake backends between the gateway and the model
// simulator, several gateway processes sharing one DynamoDB Local, clients that leave at random,
// a slow reader, and a store that stops answering. Each test checks what the client saw, that the
// organization's slots came back, and that the ledger and the usage events are exactly right.
// RELIABILITY.md at the repository root sums up the scenarios with their figures.
package reliability

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/simulator"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/tests/internal/build"
	"github.com/neocloud/kiln/tests/internal/output"
)

var gatewayBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "kiln-reliability-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bins, err := build.Commands(dir, "./functions/gateway")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		gatewayBin = bins[0]
		code := m.Run()
		stopSharedDynamo()
		return code
	}())
}

// gatewayProc is one running gateway process.
type gatewayProc struct {
	Base   string // http://127.0.0.1:PORT/v1
	cmd    *exec.Cmd
	stderr *output.Buffer
	exited chan struct{}
}

var listenLine = regexp.MustCompile(`listening on (http://\S+/v1)`)

// startGateway starts the built gateway on a free loopback port with env on top of a minimal
// environment, and stops it (SIGTERM) when the test ends.
func startGateway(t *testing.T, env ...string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{stderr: &output.Buffer{}, exited: make(chan struct{})}
	g.cmd = exec.Command(gatewayBin)
	g.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"KILN_ADDR=127.0.0.1:0",
		"KILN_SHUTDOWN_GRACE=2s",
		"AWS_ACCESS_KEY_ID=kilnlocal",
		"AWS_SECRET_ACCESS_KEY=kilnlocal",
		"AWS_REGION=us-east-1",
	}, env...)
	g.cmd.Stderr = g.stderr
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := g.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		g.cmd.Wait()
		close(g.exited)
	}()
	base := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				base <- m[1]
			}
		}
	}()
	t.Cleanup(func() { g.stop() })
	select {
	case g.Base = <-base:
	case <-g.exited:
		t.Fatalf("gateway exited at start:\n%s", g.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("gateway did not listen within 60 s:\n%s", g.stderr.String())
	}
	return g
}

func (g *gatewayProc) stop() {
	select {
	case <-g.exited:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.exited
	}
}

// kill ends the process with SIGKILL: no shutdown, no settlement.
func (g *gatewayProc) kill() {
	_ = g.cmd.Process.Kill()
	<-g.exited
}

// rssBytes reads the process's resident set size from /proc.
func (g *gatewayProc) rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Every test model has the same prices, so that expected costs are computed one way.
const (
	priceInput  = "0.06"
	priceCached = "0.03"
	priceOutput = "0.24"
)

var prices = money.Prices{Input: mustPrice(priceInput), CachedInput: mustPrice(priceCached), Output: mustPrice(priceOutput)}

func mustPrice(s string) money.Amount {
	a, err := money.ParsePrice(s)
	if err != nil {
		panic(err)
	}
	return a
}

// model is one catalog model of a test, with its single backend.
type model struct {
	ID         string
	URL        string // backend base URL, ending in /v1
	Backend    string // the backend's model name; the simulator serves it
	Continuous bool
	// ContextLength is the catalog's context length (1,000,000 when zero): with the prices
	// below, admission reserves $0.06 of a request's worst-case prompt per million tokens of it.
	ContextLength int
}

// writeCatalog writes a catalog of models and returns its path.
func writeCatalog(t *testing.T, models ...model) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("version: 1\nmodels:\n")
	for _, m := range models {
		fmt.Fprintf(&b, `  - id: %s
    owned_by: test
    created: 1754000000
    context_length: %d
    input_modalities: [text]
    parallel_tool_calls: false
    forced_tool_choice: true
    ignore_eos: true
    pricing:
      input: "%s"
      cached_input: "%s"
      output: "%s"
    backends:
      - name: %s-backend
        url: %s
        model: %s
        continuous_usage: %v
`, m.ID, cmp.Or(m.ContextLength, 1000000), priceInput, priceCached, priceOutput, m.ID, m.URL, m.Backend, m.Continuous)
	}
	path := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Load(path); err != nil {
		t.Fatalf("test catalog: %v", err)
	}
	return path
}

// startSimulator serves the model simulator for the given backend model names on loopback and
// returns its base URL (ending in /v1).
func startSimulator(t *testing.T, names ...string) string {
	t.Helper()
	var ms []simulator.Model
	for _, n := range names {
		ms = append(ms, simulator.Model{Name: n, ContextLength: 1000000})
	}
	srv := httptest.NewServer(simulator.New(simulator.Config{Models: ms}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// newOrg creates an organization with a limit, credits and a key; it returns the key.
func newOrg(t *testing.T, st store.Store, id string, limit int, credits string) string {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	if err := st.CreateOrg(ctx, store.Org{ID: id, Name: id, Status: store.OrgActive, MaxInFlight: limit, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	amount, err := money.Parse(credits)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.AddEntry(ctx, store.LedgerEntry{ID: "top_" + id, OrgID: id, Kind: store.EntryTopUp, Amount: amount, Note: "test credits", At: now}); err != nil {
		t.Fatal(err)
	}
	key, keyID, hash, err := apikey.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(ctx, store.Key{ID: keyID, OrgID: id, Hash: hash, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	return key
}

// chatBody is a chat request whose last user message is content.
func chatBody(modelID, content string, stream bool, maxTokens int) string {
	s := ""
	if stream {
		s = `"stream":true,`
	}
	return fmt.Sprintf(`{"model":%q,%s"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, modelID, s, maxTokens, content)
}

// estimatedPrompt is the gateway's estimate of a chat request's prompt tokens (docs/api.md,
// "Billing of partial answers"): one token per whitespace-separated word of each message.
func estimatedPrompt(contents ...string) int64 {
	var n int64
	for _, c := range contents {
		n += int64(len(strings.Fields(c)))
	}
	return n
}

func cost(t *testing.T, prompt, completion int64) money.Amount {
	t.Helper()
	c, err := prices.Cost(prompt, 0, completion)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// result is what a client saw of one request.
type result struct {
	status    int
	ctype     string
	genID     string
	body      []byte
	err       error // transport error while reading
	chunks    int   // streamed data events carrying generated content
	done      bool  // data: [DONE] came
	errCode   string
	afterErr  bool // data came after the error event
	keepalive bool
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0, IdleConnTimeout: 30 * time.Second}}

// post sends one inference request and reads the whole answer.
func post(ctx context.Context, base, key, path, body string) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	r := result{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), genID: resp.Header.Get("X-Neocloud-Generation-Id")}
	r.body, r.err = io.ReadAll(resp.Body)
	if strings.HasPrefix(r.ctype, "text/event-stream") {
		r.parseSSE()
	}
	return r
}

// parseSSE reads the events of a streamed answer.
func (r *result) parseSSE() {
	for _, ev := range strings.Split(string(r.body), "\n\n") {
		if strings.HasPrefix(ev, ": keepalive") {
			r.keepalive = true
			continue
		}
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			continue
		}
		if r.errCode != "" {
			r.afterErr = true
		}
		if data == "[DONE]" {
			r.done = true
			continue
		}
		if code, ok := errorCode(data); ok {
			r.errCode = code
			continue
		}
		if isContent(data) {
			r.chunks++
		}
	}
}

var (
	errCodeRe = regexp.MustCompile(`^\{"error":\{.*"code":"([a-z_]+)"\}\}$`)
	contentRe = regexp.MustCompile(`"(?:content|text)":"[^"]`)
	choicesRe = regexp.MustCompile(`"choices":\[\{`)
)

func errorCode(data string) (string, bool) {
	m := errCodeRe.FindStringSubmatch(data)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// isContent tells a chunk that carries generated text (what the gateway counts as delivered).
func isContent(data string) bool {
	return choicesRe.MatchString(data) && contentRe.MatchString(data)
}

// waitEvent waits until the request's usage event is recorded (settlement runs after the
// response ends) and returns it.
func waitEvent(t *testing.T, st store.Store, orgID, genID string) usage.Event {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ev, err := st.Generation(context.Background(), orgID, genID)
		if err == nil {
			return ev
		}
		if time.Now().After(deadline) {
			t.Fatalf("no usage event for %s: %v", genID, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// debits returns the organization's debits by generation id, and their sum.
func debits(t *testing.T, st store.Store, orgID string) (map[string][]money.Amount, money.Amount) {
	t.Helper()
	entries, err := st.Ledger(context.Background(), orgID)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string][]money.Amount{}
	var sum money.Amount
	for _, e := range entries {
		if e.Kind == store.EntryDebit {
			by[e.ID] = append(by[e.ID], e.Amount)
			sum += e.Amount
		}
	}
	return by, sum
}

// checkBilled checks the request's event costs want and the ledger debits it exactly once (a
// free request may have no debit at all).
func checkBilled(t *testing.T, st store.Store, ev usage.Event, want money.Amount) {
	t.Helper()
	if ev.Cost != want {
		t.Errorf("%s: event cost %s (prompt %d, completion %d, estimated %v), want %s", ev.GenerationID, ev.Cost, ev.PromptTokens, ev.CompletionTokens, ev.Estimated, want)
	}
	by, _ := debits(t, st, ev.OrgID)
	d := by[ev.GenerationID]
	switch {
	case len(d) > 1:
		t.Errorf("%s debited %d times: %v", ev.GenerationID, len(d), d)
	case len(d) == 1 && d[0] != -want:
		t.Errorf("%s debited %s, want %s", ev.GenerationID, d[0], -want)
	case len(d) == 0 && want != 0:
		t.Errorf("%s not debited, want %s", ev.GenerationID, -want)
	}
}

// waitIdle waits until the organization holds no slot.
func waitIdle(t *testing.T, st store.Store, orgID string, within time.Duration) {
	t.Helper()
	waitHeld(t, st, orgID, 0, within)
}

// waitHeld waits until the store lists n slots of the organization in flight. The embedded store
// lists the gateway's copy of its slots, a commit or two behind them.
func waitHeld(t *testing.T, st store.Store, orgID string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		held, err := st.InFlight(context.Background(), orgID, time.Now())
		if err == nil && len(held) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d slots after %v, want %d (%v)", orgID, len(held), within, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fillLimit checks that the organization can again hold its whole limit of requests at once:
// limit slow streams all get 200, one more gets 429, and afterwards every slot is free again.
func fillLimit(t *testing.T, st store.Store, base, key, orgID, modelID string, limit int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var open []*http.Response
	defer func() {
		for _, r := range open {
			r.Body.Close()
		}
	}()
	// A request answered a moment ago may still be settling (its slot is freed as its handler
	// returns): a 429 is tried again for a second, far less than a leaked slot's 60 s lease.
	grace := time.Now().Add(time.Second)
	for i := 0; i < limit; {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions",
			strings.NewReader(chatBody(modelID, fmt.Sprintf("fill %d [[sim:delay_ms=100]]", i), true, 50)))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("fill slot %d: %v", i, err)
		}
		if resp.StatusCode == 429 && time.Now().Before(grace) {
			resp.Body.Close()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		open = append(open, resp)
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("slot %d of %d: %d %s — a slot was not released", i+1, limit, resp.StatusCode, b)
		}
		i++
	}
	r := post(ctx, base, key, "/chat/completions", chatBody(modelID, "one too many", true, 1))
	if r.status != 429 {
		t.Fatalf("request over the limit of %d: %d %s", limit, r.status, r.body)
	}
	// The store lists them before they end, so that waitIdle below waits for their release.
	waitHeld(t, st, orgID, limit, 10*time.Second)
	for _, r := range open {
		r.Body.Close()
	}
	open = nil
	waitIdle(t, st, orgID, 10*time.Second)
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
