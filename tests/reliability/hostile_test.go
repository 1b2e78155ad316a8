package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/tests/internal/build"
)

// The hostile-client suite: what a client can send a gateway, over real sockets, on the built
// binary, on the embedded store and on DynamoDB Local. Each case says what the client must get;
// afterwards, for the whole barrage: no 5xx from the gateway itself (a 502 only where a backend
// fault was asked for), no answer later than its bound (the deadlines here are hang guards), every
// admitted request settled, each usage event's cost equal to its one ledger debit and no debit
// without an event, the hostile organization's slots back to zero, and another organization
// served as before. RELIABILITY.md lists the cases with their outcomes.

// hostileTimeout is the gateway's header and body timeout in this suite (10 s by default): short,
// so that the stalls are answered quickly; the hang guard is well above it.
const (
	hostileTimeout = "1s"
	hangGuard      = 30 * time.Second
)

// hostileCase is one thing a client sends, as bytes on a fresh connection.
type hostileCase struct {
	name string
	// raw builds the bytes sent; key is the hostile organization's key.
	raw func(key string) []byte
	// then, when set, runs on the connection after raw was written (stall, half-close).
	then func(c *net.TCPConn)
	// answers is how many responses are read (pipelining); 1 when 0.
	answers int
	// status is what the client must get (for each answer); 0 means the server may close the
	// connection without an answer.
	status []int
	// code is the JSON error code the first answer carries, when set.
	code string
	// check looks at the first answer's body, when set.
	check func(t *testing.T, body []byte)
	// fault: the request asks the backend to fail, so a 502 is the backend's, not the gateway's.
	fault bool
	// leave: the client resets the connection after the answer's first event.
	leave bool
}

// hostileOutcome is what one case got, for the summary.
type hostileOutcome struct {
	name     string
	statuses []int
	genIDs   []string
	bytes    int
}

func TestHostileClients(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		data := filepath.Join(dir, "data")
		st, err := sqlite.Open(data, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		runHostile(t, st, []string{"KILN_DATA_DIR=" + data}, []string{"KILN_DATA_DIR=" + data})
	})
	t.Run("dynamodb", func(t *testing.T) {
		ddb := dynamoServer(t)
		st, prefix := newDynamoStore(t, ddb.Endpoint)
		env := []string{"KILN_STORE=dynamodb", "KILN_DYNAMODB_ENDPOINT=" + ddb.Endpoint, "KILN_TABLE_PREFIX=" + prefix}
		runHostile(t, st, append(env, "KILN_DATA_DIR="+filepath.Join(t.TempDir(), "unused")), env)
	})
}

// hostileCatalog has a text-only model that refuses ignore_eos on chat, as gpt-oss does.
func hostileCatalog(t *testing.T, simURL string) string {
	t.Helper()
	doc := fmt.Sprintf(`version: 1
models:
  - id: plain
    owned_by: test
    created: 1754000000
    context_length: 1000000
    input_modalities: [text]
    parallel_tool_calls: false
    forced_tool_choice: false
    ignore_eos: false
    pricing: {input: "%s", cached_input: "%s", output: "%s"}
    backends:
      - {name: plain-backend, url: %s, model: sim/plain, continuous_usage: false}
`, priceInput, priceCached, priceOutput, simURL)
	path := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func runHostile(t *testing.T, st store.Store, gwEnv, ctlEnv []string) {
	simURL := startSimulator(t, "sim/plain")
	const org, other = "org_hostile", "org_bystander"
	key := newOrg(t, st, org, 8, "100.00")
	otherKey := newOrg(t, st, other, 8, "100.00")
	gw := startGateway(t, append(gwEnv,
		"KILN_CATALOG="+hostileCatalog(t, simURL),
		"KILN_HEADER_TIMEOUT="+hostileTimeout,
		"KILN_BODY_TIMEOUT="+hostileTimeout,
		"KILN_MAX_BODY=1048576",
	)...)
	u, _ := url.Parse(gw.Base)
	addr := u.Host

	started := time.Now()
	var outcomes []hostileOutcome
	genIDs := map[string]string{} // generation id → case
	for _, tc := range hostileCases() {
		o := runCase(t, addr, key, tc)
		outcomes = append(outcomes, o)
		for _, id := range o.genIDs {
			genIDs[id] = tc.name
		}
	}
	// Many at once: the in-flight limit of 8 holds against a flood of hostile requests, and every
	// slot comes back.
	flood(t, addr, key, 64)

	// Every admitted request is settled (its id names an event) and the slots come back.
	for id := range genIDs {
		waitEvent(t, st, org, id)
	}
	waitIdle(t, st, org, 15*time.Second)
	// Ledger = events: each event's cost is its one debit, and no debit is without an event.
	events, err := st.Usage(context.Background(), org, started.Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var billed money.Amount
	seen := map[string]bool{}
	for _, ev := range events {
		seen[ev.GenerationID] = true
		billed += ev.Cost
		checkBilled(t, st, ev, ev.Cost)
		name := genIDs[ev.GenerationID]
		if len(ev.Model) > 256 || len(ev.FinishReason) > 64 || ev.DurationMillis < ev.TTFTMillis {
			t.Errorf("%s %s: event model of %d bytes, finish_reason of %d, duration %d < ttft %d", ev.GenerationID, name, len(ev.Model), len(ev.FinishReason), ev.DurationMillis, ev.TTFTMillis)
		}
		if ev.Status == "client_disconnected" && ev.Backend == "" {
			t.Errorf("%s %s: a disconnect without the backend that was called", ev.GenerationID, name)
		}
	}
	by, sum := debits(t, st, org)
	for id := range by {
		if !seen[id] {
			t.Errorf("debit %s has no usage event", id)
		}
	}
	if billed != -sum {
		t.Errorf("events cost %s, debits %s", billed, -sum)
	}

	// Another organization is served as before.
	r := post(context.Background(), gw.Base, otherKey, "/chat/completions", chatBody("plain", "bystander", true, 3))
	if r.status != 200 || !r.done {
		t.Errorf("another organization after the barrage: %d %s", r.status, r.body)
	}
	waitIdle(t, st, other, 15*time.Second)

	csvBytes := checkUsageCSV(t, ctlEnv, org)

	t.Logf("%d cases, %d usage events (each settled, each debited its cost once); events cost %s, debits %s; usage CSV %d bytes",
		len(outcomes), len(events), billed, -sum, csvBytes)
	for _, o := range outcomes {
		t.Logf("  %-58s %v (%d bytes)", o.name, o.statuses, o.bytes)
	}
}

// runCase sends tc on a fresh connection and checks what came back.
func runCase(t *testing.T, addr, key string, tc hostileCase) hostileOutcome {
	t.Helper()
	o := hostileOutcome{name: tc.name}
	d := net.Dialer{Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("%s: %v", tc.name, err)
	}
	c := nc.(*net.TCPConn)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := c.Write(tc.raw(key)); err != nil {
		// The server may stop reading a request it refused (431) while it is still being written.
		if !isReset(err) {
			t.Errorf("%s: write: %v", tc.name, err)
		}
	}
	if tc.then != nil {
		tc.then(c)
	}
	br := bufio.NewReader(c)
	n := max(tc.answers, 1)
	for i := range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if len(tc.status) > i && tc.status[i] == 0 {
				o.statuses = append(o.statuses, 0)
				continue
			}
			if os.IsTimeout(err) {
				t.Errorf("%s: no answer %d within %v (a hang)", tc.name, i+1, hangGuard)
			} else {
				t.Errorf("%s: answer %d: %v", tc.name, i+1, err)
			}
			return o
		}
		if tc.leave {
			o.statuses = append(o.statuses, resp.StatusCode)
			o.genIDs = append(o.genIDs, resp.Header.Get("X-Neocloud-Generation-Id"))
			for {
				line, err := br.ReadString('\n')
				if err != nil || strings.HasPrefix(line, "data: {") {
					break
				}
			}
			_ = c.SetLinger(0)
			return o
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil && !isReset(err) {
			t.Errorf("%s: reading answer %d: %v", tc.name, i+1, err)
		}
		o.statuses = append(o.statuses, resp.StatusCode)
		o.bytes += len(body)
		if id := resp.Header.Get("X-Neocloud-Generation-Id"); id != "" {
			o.genIDs = append(o.genIDs, id)
		}
		if resp.StatusCode >= 500 && !(tc.fault && resp.StatusCode == 502) {
			t.Errorf("%s: %d from the gateway itself: %q", tc.name, resp.StatusCode, abbreviate(body))
		}
		if want := tc.status[min(i, len(tc.status)-1)]; resp.StatusCode != want {
			t.Errorf("%s: answer %d is %d, want %d: %q", tc.name, i+1, resp.StatusCode, want, abbreviate(body))
		}
		if resp.StatusCode != 200 && resp.StatusCode != 502 && !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Errorf("%s: a %d that is not JSON: %q %q", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"), abbreviate(body))
		}
		if i == 0 && tc.code != "" {
			var e struct {
				Error struct {
					Code *string `json:"code"`
				} `json:"error"`
			}
			if json.Unmarshal(body, &e) != nil || e.Error.Code == nil || *e.Error.Code != tc.code {
				t.Errorf("%s: code %v, want %q: %q", tc.name, e.Error.Code, tc.code, abbreviate(body))
			}
		}
		if i == 0 && tc.check != nil {
			tc.check(t, body)
		}
		if len(body) > 64<<10 && resp.StatusCode != 200 {
			t.Errorf("%s: a %d of %d bytes", tc.name, resp.StatusCode, len(body))
		}
	}
	return o
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe"))
}

func abbreviate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// request is an HTTP/1.1 request with a body, as bytes.
func request(method, path, key, body string, headers ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: gateway\r\n", method, path)
	if key != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", key)
	}
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if method == http.MethodPost {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.Bytes()
}

func chat(key, body string) []byte {
	return request(http.MethodPost, "/v1/chat/completions", key, body)
}

// withMessages is a chat body for model plain with the given messages JSON and extra members
// (max_tokens 3 unless they set it).
func withMessages(msgs string, extra ...string) string {
	b := `{"model":"plain","messages":` + msgs
	if !strings.Contains(strings.Join(extra, ","), `"max_tokens"`) {
		b += `,"max_tokens":3`
	}
	for _, e := range extra {
		b += "," + e
	}
	return b + "}"
}

const hi = `[{"role":"user","content":"hi"}]`

func bodyShorterThan(n int) func(*testing.T, []byte) {
	return func(t *testing.T, b []byte) {
		t.Helper()
		if len(b) > n {
			t.Errorf("answer of %d bytes, want at most %d", len(b), n)
		}
	}
}

func bodyContains(s string) func(*testing.T, []byte) {
	return func(t *testing.T, b []byte) {
		t.Helper()
		if !bytes.Contains(b, []byte(s)) {
			t.Errorf("answer %q does not contain %q", abbreviate(b), s)
		}
	}
}

func hostileCases() []hostileCase {
	model := func(id string) func(string) []byte {
		return func(key string) []byte {
			b, _ := json.Marshal(id)
			return chat(key, `{"model":`+string(b)+`,"messages":`+hi+`}`)
		}
	}
	body := func(b string) func(string) []byte { return func(key string) []byte { return chat(key, b) } }
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	return []hostileCase{
		// Unbounded strings.
		{name: "model id of 450 KB", raw: model(strings.Repeat("m", 450000)), status: []int{404}, code: "model_not_found", check: bodyShorterThan(400)},
		{name: "model id of 1 MB (under the 1 MiB body limit)", raw: model(strings.Repeat("é", 500000)), status: []int{404}, code: "model_not_found", check: bodyShorterThan(400)},
		{name: "model id of 1.1 KB", raw: model(strings.Repeat("x", 1100)), status: []int{404}, code: "model_not_found", check: bodyShorterThan(400)},
		{name: "model id of 257 bytes", raw: model(strings.Repeat("x", 257)), status: []int{404}, code: "model_not_found"},
		{name: "formula model id =HYPERLINK", raw: model(`=HYPERLINK("http://x","y")`), status: []int{404}, code: "model_not_found"},
		{name: "formula model ids + @ - tab CR", raw: model("+1+1"), status: []int{404}, code: "model_not_found"},
		{name: "formula model id @", raw: model("@SUM(A1)"), status: []int{404}, code: "model_not_found"},
		{name: "formula model id -", raw: model("-2+3"), status: []int{404}, code: "model_not_found"},
		{name: "formula model id tab", raw: model("\t=1"), status: []int{404}, code: "model_not_found"},
		{name: "model id with CR LF and a header", raw: model("x\r\nSet-Cookie: a=b"), status: []int{404}, code: "model_not_found"},
		{name: "model id with NUL", raw: model("a\x00b"), status: []int{404}, code: "model_not_found"},
		{name: "model id of invalid UTF-8", raw: body("{\"model\":\"pl\xffain\",\"messages\":" + hi + "}"), status: []int{404}, code: "model_not_found"},
		{name: "model id with a lone surrogate", raw: body(`{"model":"pl\ud800ain","messages":` + hi + `}`), status: []int{404}, code: "model_not_found"},
		{name: "path of 60 KB", raw: func(key string) []byte {
			return request(http.MethodGet, "/v1/models/"+strings.Repeat("p", 60000), key, "")
		}, status: []int{404}, code: "model_not_found", check: bodyShorterThan(400)},
		{name: "unknown path of 60 KB", raw: func(key string) []byte { return request(http.MethodGet, "/"+strings.Repeat("p", 60000), key, "") },
			status: []int{404}, code: "unknown_url", check: bodyShorterThan(400)},
		{name: "generation id of 60 KB", raw: func(key string) []byte {
			return request(http.MethodGet, "/v1/generation?id=gen-"+strings.Repeat("9", 60000), key, "")
		}, status: []int{404}, code: "generation_not_found", check: bodyShorterThan(400)},
		// Flags read as the backend reads them.
		{name: `ignore_eos "true" on a gpt-oss-like chat`, raw: body(withMessages(hi, `"ignore_eos":"true"`)), status: []int{400}, code: "unsupported_parameter"},
		{name: "ignore_eos 1", raw: body(withMessages(hi, `"ignore_eos":1`)), status: []int{400}, code: "unsupported_parameter"},
		{name: `ignore_eos "yes"`, raw: body(withMessages(hi, `"ignore_eos":"yes"`)), status: []int{400}, code: "invalid_type"},
		{name: `stream "yes"`, raw: body(withMessages(hi, `"stream":"yes"`)), status: []int{400}, code: "invalid_type"},
		// Duplicate names at every depth.
		{name: "duplicate top-level model", raw: body(`{"model":"plain","model":"other","messages":` + hi + `}`), status: []int{400}, check: bodyContains(`duplicate key \"model\"`)},
		{name: "duplicate type in a content part", raw: body(withMessages(`[{"role":"user","content":[{"type":"image_url","type":"image_url","image_url":{"url":"http://x/a.png"}}]}]`)),
			status: []int{400}, check: bodyContains(`duplicate key \"type\"`)},
		{name: "duplicate role", raw: body(withMessages(`[{"role":"user","role":"system","content":"hi"}]`)), status: []int{400}, check: bodyContains(`duplicate key \"role\"`)},
		{name: "duplicate key 900 levels deep", raw: body(withMessages(hi, `"x":`+strings.Repeat(`{"a":`, 900)+`{"k":1,"k":2}`+strings.Repeat("}", 900))),
			status: []int{400}, check: bodyContains("duplicate key")},
		// Malformed and extreme JSON.
		{name: "nesting 1001 deep", raw: body(withMessages(hi, `"x":`+deep(1001))), status: []int{400}},
		{name: "nesting 998 deep (forwarded)", raw: body(withMessages(hi, `"x":`+deep(998))), status: []int{200}},
		{name: "invalid UTF-8 in content (forwarded)", raw: body(withMessages("[{\"role\":\"user\",\"content\":\"caf\xc3\x28 \xff\"}]")), status: []int{200}},
		{name: "lone surrogates in content (forwarded)", raw: body(withMessages(`[{"role":"user","content":"\ud800 \udfff \ud83d"}]`)), status: []int{200}},
		{name: "NUL escaped in content (forwarded)", raw: body(withMessages(`[{"role":"user","content":"a\u0000b"}]`)), status: []int{200}},
		{name: "raw NUL byte in a string", raw: body(withMessages("[{\"role\":\"user\",\"content\":\"a\x00b\"}]")), status: []int{400}},
		{name: "NUL bytes after the body", raw: body(withMessages(hi) + "\x00\x00"), status: []int{400}},
		{name: "huge max_tokens", raw: body(`{"model":"plain","max_tokens":1e400,"messages":` + hi + `}`), status: []int{400}},
		{name: "max_tokens of 40 digits", raw: body(`{"model":"plain","max_tokens":1234567890123456789012345678901234567890,"messages":` + hi + `}`), status: []int{400}},
		{name: "50 000 keys in an unknown member (forwarded)", raw: func(key string) []byte {
			var b strings.Builder
			b.WriteString(`{"model":"plain","max_tokens":2,"messages":` + hi + `,"x":{`)
			for i := range 50000 {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(`"k` + strconv.Itoa(i) + `":0`)
			}
			b.WriteString("}}")
			return chat(key, b.String())
		}, status: []int{200}},
		{name: "trailing garbage", raw: body(withMessages(hi) + " x"), status: []int{400}},
		{name: "empty body", raw: body(""), status: []int{400}},
		{name: "body over the limit", raw: body(`{"model":"plain","x":"` + strings.Repeat("a", 1<<20) + `"}`), status: []int{413}, code: "request_too_large"},
		// HTTP framing.
		{name: "headers over 64 KiB", raw: func(string) []byte {
			return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-Big: " + strings.Repeat("a", 100<<10) + "\r\n\r\n")
		}, status: []int{431}, code: "request_header_fields_too_large"},
		{name: "20 000 headers", raw: func(string) []byte {
			return []byte("GET /v1/models HTTP/1.1\r\nHost: g\r\n" + strings.Repeat("X-A: b\r\n", 20000) + "\r\n")
		}, status: []int{431}, code: "request_header_fields_too_large"},
		{name: "two Authorization headers", raw: func(key string) []byte {
			return request(http.MethodPost, "/v1/chat/completions", key, withMessages(hi), "Authorization: Bearer "+key)
		}, status: []int{401}, code: "invalid_api_key"},
		{name: "malformed request line", raw: func(string) []byte { return []byte("POST /v1/chat/completions\r\n\r\n") }, status: []int{400}, code: "malformed_request"},
		{name: "NUL in a header", raw: func(key string) []byte { return []byte("GET /v1/models HTTP/1.1\r\nHost: g\r\nX-A: a\x00b\r\n\r\n") }, status: []int{400}, code: "malformed_request"},
		{name: "bad chunk size", raw: func(key string) []byte {
			return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + key + "\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
		}, status: []int{400}},
		{name: "unknown transfer coding", raw: func(key string) []byte {
			return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: gzip\r\n\r\n")
		}, status: []int{400}, code: "unsupported_transfer_encoding"},
		{name: "pipelined: three requests in one write", raw: func(key string) []byte {
			b := chat(key, withMessages(`[{"role":"user","content":"first"}]`))
			b = append(b, chat(key, `{"model":"nope","messages":`+hi+`}`)...)
			return append(b, chat(key, withMessages(`[{"role":"user","content":"third"}]`, `"stream":true`))...)
		}, answers: 3, status: []int{200, 404, 200}},
		// net/http reads a half-close as a client that left; the backend's answer is slow enough
		// that it has: the answer is then aborted, never an empty 200.
		{name: "half-closed after the request", raw: func(key string) []byte {
			return chat(key, withMessages(`[{"role":"user","content":"[[sim:first_byte_ms=300]]"}]`))
		}, then: func(c *net.TCPConn) { _ = c.CloseWrite() }, status: []int{0}},
		{name: "half-closed mid-body", raw: func(key string) []byte {
			b := chat(key, withMessages(hi))
			return b[:len(b)-10]
		}, then: func(c *net.TCPConn) { _ = c.CloseWrite() }, status: []int{400}},
		{name: "slowloris headers", raw: func(string) []byte { return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-A: 1\r\n") },
			status: []int{408}, code: "request_timeout"},
		{name: "nothing sent at all", raw: func(string) []byte { return nil }, status: []int{408}, code: "request_timeout"},
		{name: "stalled body, no key (Content-Length 1000, 10 bytes)", raw: func(string) []byte {
			return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Length: 1000\r\n\r\n{\"model\":1")
		}, status: []int{408}, code: "request_timeout"},
		{name: "stalled body, with a key", raw: func(key string) []byte {
			return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + key + "\r\nContent-Length: 1000\r\n\r\n{\"model\":1")
		}, status: []int{408}, code: "request_timeout"},
		{name: "stalled chunked body", raw: func(key string) []byte {
			return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + key + "\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"mo\r\n")
		}, status: []int{408}, code: "request_timeout"},
		// Backend faults the client asks for: the 502 is the backend's.
		{name: "backend 500 asked for", raw: body(withMessages(`[{"role":"user","content":"[[sim:status=500]]"}]`)), status: []int{502}, fault: true},
		{name: "stream dropped by the backend", raw: body(withMessages(`[{"role":"user","content":"[[sim:drop_after=1]]"}]`, `"stream":true`, `"max_tokens":5`)), status: []int{200}, fault: true},
		{name: "client leaves mid-stream", raw: body(withMessages(`[{"role":"user","content":"slow [[sim:delay_ms=50]]"}]`, `"stream":true`, `"max_tokens":50`)),
			leave: true, status: []int{200}},
		{name: "client leaves before a non-streamed answer", raw: body(withMessages(`[{"role":"user","content":"[[sim:first_byte_ms=300]]"}]`)),
			then: func(c *net.TCPConn) { time.Sleep(50 * time.Millisecond); _ = c.SetLinger(0); c.Close() }, status: []int{0}},
	}
}

// flood sends n requests at once, each a stream that takes a while: at most the organization's 8
// are admitted at a time, the rest get 429, and nothing else.
func flood(t *testing.T, addr, key string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := runCaseQuiet(addr, chat(key, withMessages(fmt.Sprintf(`[{"role":"user","content":"flood %d [[sim:delay_ms=20]]"}]`, i), `"stream":true`, `"max_tokens":10`)))
			mu.Lock()
			statuses[o]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if statuses[200] == 0 || statuses[200]+statuses[429] != n {
		t.Errorf("flood of %d: %v; want only 200 and 429", n, statuses)
	}
	t.Logf("flood of %d at once: %v", n, statuses)
}

func runCaseQuiet(addr string, raw []byte) int {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return -1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := c.Write(raw); err != nil {
		return -1
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return -1
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

var (
	kilnctlBin  string
	kilnctlErr  error
	kilnctlOnce sync.Once
)

// checkUsageCSV runs the built kilnctl's usage --csv for the organization: formula-leading cells
// are escaped and the output stays small, whatever the model ids were. It returns its size.
func checkUsageCSV(t *testing.T, env []string, org string) int {
	t.Helper()
	kilnctlOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kiln-reliability-kilnctl-")
		if err != nil {
			kilnctlErr = err
			return
		}
		bins, err := build.Commands(dir, "./infra/kilnctl")
		if err != nil {
			kilnctlErr = err
			return
		}
		kilnctlBin = bins[0]
	})
	if kilnctlErr != nil {
		t.Fatal(kilnctlErr)
	}
	day := time.Now().UTC().Format(time.DateOnly)
	cmd := exec.Command(kilnctlBin, "usage", "--org", org, "--from", day, "--to", day, "--csv")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"AWS_ACCESS_KEY_ID=kilnlocal", "AWS_SECRET_ACCESS_KEY=kilnlocal", "AWS_REGION=us-east-1"}, env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kilnctl usage --csv: %v", err)
	}
	if len(out) > 1<<20 {
		t.Errorf("kilnctl usage --csv printed %d bytes", len(out))
	}
	var models []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, formula := range []string{`=HYPERLINK`, "+1+1", "@SUM", "-2+3"} {
			if strings.Contains(line, formula) {
				models = append(models, line)
				if !strings.Contains(line, "'"+formula) && !strings.Contains(line, `"'`+formula) {
					t.Errorf("a live formula in the usage CSV: %q", line)
				}
			}
		}
	}
	sort.Strings(models)
	if len(models) < 4 {
		t.Errorf("the formula model ids are not in the usage CSV:\n%s", out)
	}
	return len(out)
}
