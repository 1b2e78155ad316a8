package simulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const (
	qwen   = "Qwen/Qwen3-32B"
	gptOSS = "openai/gpt-oss-120b"
)

var testNow = time.Unix(1710000000, 0)

// Requests returns how many requests the two inference endpoints have received, valid or not.
func (s *Server) Requests() int64 { return s.requests.Load() }

// newTestServer serves a simulator over real HTTP, as vLLM unless a Software is given:
// qwen3-32b with a 100-token context that refuses tool_choice "required", and gpt-oss-120b that
// accepts it and reports cached tokens (the server's cache-report flag).
func newTestServer(t *testing.T, sw ...Software) (*Server, *httptest.Server) {
	t.Helper()
	server := VLLM
	if len(sw) > 0 {
		server = sw[0]
	}
	sim := New(Config{
		Models: []Model{
			{Name: qwen, ContextLength: 100, RejectRequiredToolChoice: true, Server: server},
			{Name: gptOSS, ContextLength: 131072, Server: server, CachedTokens: true},
		},
		Now:    func() time.Time { return testNow },
		Server: server,
	})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return sim, srv
}

func post(t *testing.T, srv *httptest.Server, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readJSON reads a JSON body, keeping numbers exact.
func readJSON(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return decodeObject(t, body)
}

func decodeObject(t *testing.T, data []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return v
}

// stream is a parsed text/event-stream body.
type stream struct {
	chunks []map[string]any // the JSON events, in order
	raw    [][]byte
	done   bool  // the stream ended with data: [DONE]
	err    error // what ended the read: nil after a clean EOF
}

// readStream parses server-sent events until the body ends, recording whether it ended on
// [DONE] or was cut.
func readStream(t *testing.T, resp *http.Response) stream {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q, want text/event-stream", ct)
	}
	var s stream
	r := bufio.NewReader(resp.Body)
	var data []byte
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if !errors.Is(err, io.EOF) || line != "" {
				s.err = err
			}
			return s
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[len("data: "):]...)
		case line == "":
			if data == nil {
				continue
			}
			if s.done {
				t.Fatalf("event after [DONE]: %s", data)
			}
			if string(data) == "[DONE]" {
				s.done = true
			} else {
				s.raw = append(s.raw, data)
				s.chunks = append(s.chunks, decodeObject(t, data))
			}
			data = nil
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
}

// chatBody builds a chat request with one user message.
func chatBody(model, content string, extra string) string {
	msg, _ := json.Marshal(content)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(msg) + `}]`
	if extra != "" {
		body += "," + extra
	}
	return body + "}"
}

func completionBody(model, prompt string, extra string) string {
	p, _ := json.Marshal(prompt)
	body := `{"model":"` + model + `","prompt":` + string(p)
	if extra != "" {
		body += "," + extra
	}
	return body + "}"
}

// at walks a decoded JSON value: at(v, "choices", 0, "message", "content").
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: %v is not an object", path, v)
			}
			if v, ok = m[k]; !ok {
				t.Fatalf("at %v: no key %q in %v", path, k, m)
			}
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("at %v: %v has no index %d", path, v, k)
			}
			v = a[k]
		}
	}
	return v
}

func has(v map[string]any, key string) bool {
	_, ok := v[key]
	return ok
}

// num returns a JSON integer as int.
func num(t *testing.T, v any) int {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	i, err := n.Int64()
	if err != nil {
		t.Fatalf("%v is not an integer", v)
	}
	return int(i)
}

type wantUsage struct {
	prompt, completion int
	cached             int // -1: no prompt_tokens_details
}

func checkUsage(t *testing.T, u any, want wantUsage) {
	t.Helper()
	m, ok := u.(map[string]any)
	if !ok {
		t.Fatalf("usage = %v, want an object", u)
	}
	got := wantUsage{
		prompt:     num(t, m["prompt_tokens"]),
		completion: num(t, m["completion_tokens"]),
		cached:     -1,
	}
	if total := num(t, m["total_tokens"]); total != got.prompt+got.completion {
		t.Errorf("total_tokens = %d, want %d", total, got.prompt+got.completion)
	}
	if d, ok := m["prompt_tokens_details"]; ok && d != nil { // SGLang writes null
		got.cached = num(t, at(t, d, "cached_tokens"))
	}
	if got != want {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
