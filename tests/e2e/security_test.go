package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecrets runs a small mixed workload and then reads everything the gateway left on disk and
// in its logs: the key, the prompts and the completions appear nowhere.
func TestSecrets(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	const secretPrompt = "zebra-quartz-marmalade"
	bodies := []string{
		`{"model":"qwen3-32b","messages":[{"role":"user","content":"` + secretPrompt + `"}],"max_tokens":3}`,
		`{"model":"gpt-oss-120b","stream":true,"messages":[{"role":"user","content":"` + secretPrompt + `"}],"max_tokens":3}`,
		`{"model":"gpt-oss-120b","prompt":"` + secretPrompt + `","max_tokens":3}`,
		`{"model":"qwen3-32b","messages":[{"role":"user","content":"` + secretPrompt + ` [[sim:status=400]]"}]}`,
		`{"model":"qwen3-32b","messages":[{"role":"user","content":"` + secretPrompt + ` [[sim:status=500]]"}]}`,
		`{"model":"qwen3-32b","messages":[{"role":"user","content":"` + secretPrompt + ` [[sim:drop_after=1]]"}],"stream":true}`,
		`{"model":"no-such-model","messages":[{"role":"user","content":"` + secretPrompt + `"}]}`,
		`{"model":"qwen3-32b","messages":[{"role":"user","content":"` + secretPrompt + `"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
	}
	for _, b := range bodies {
		for _, path := range []string{"/chat/completions", "/completions"} {
			resp := s.post(t, ctx, path, s.Key, b)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	// A wrong key, too: it must not be logged either.
	wrong := "kiln-" + strings.Repeat("Q", 40)
	resp := s.post(t, ctx, "/chat/completions", wrong, bodies[0])
	resp.Body.Close()
	s.stop(t)

	logs := s.stderr.String()
	if !strings.Contains(logs, `"generation_id"`) {
		t.Fatalf("no request was logged; the test would prove nothing:\n%s", logs)
	}
	for _, secret := range []string{s.Key, s.Key[13:], wrong, secretPrompt, "tok0", "tok1"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs contain %q", secret)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a log line is not JSON: %s", line)
		}
	}
	// The store holds the key's hash and its display prefix, never the key.
	files, _ := filepath.Glob(filepath.Join(s.DataDir, "*"))
	if len(files) == 0 {
		t.Fatal("no store files")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(s.Key)) || bytes.Contains(b, []byte(s.Key[13:])) {
			t.Errorf("%s holds the API key", filepath.Base(f))
		}
		if bytes.Contains(b, []byte(secretPrompt)) {
			t.Errorf("%s holds a prompt", filepath.Base(f))
		}
	}
}

// TestOrganizationsAreIsolated: one organization cannot read another's generations or credits.
func TestOrganizationsAreIsolated(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	var org struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(s.kilnctl(t, "org", "create", "--name", "Other", "--json")), &org); err != nil {
		t.Fatal(err)
	}
	var key struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(s.kilnctl(t, "key", "create", "--org", org.ID, "--json")), &key); err != nil {
		t.Fatal(err)
	}
	resp := s.post(t, ctx, "/chat/completions", s.Key, chatBody)
	resp.Body.Close()
	gen := resp.Header.Get("X-Neocloud-Generation-Id")
	get := func(k, path string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, s.BaseURL+path, nil)
		req.Header.Set("Authorization", "Bearer "+k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	eventually(t, "the settlement", func() bool { st, _ := get(s.Key, "/generation?id="+gen); return st == 200 })
	if st, body := get(key.Key, "/generation?id="+gen); st != 404 || !strings.Contains(body, "generation_not_found") {
		t.Errorf("another organization's generation: %d %s, want 404", st, body)
	}
	if _, body := get(key.Key, "/credits"); !strings.Contains(body, org.ID) || strings.Contains(body, "org_demo") {
		t.Errorf("credits show another organization: %s", body)
	}
}

// rawExchange sends raw bytes on a new connection and returns the status line of the answer.
func rawExchange(t *testing.T, addr string, request []byte) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(request); err != nil {
		return "write failed: " + err.Error()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "no answer: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// TestHostileHeaders: smuggling attempts, header injection, huge headers and duplicated keys
// are refused before anything reaches a backend or the store.
func TestHostileHeaders(t *testing.T) {
	s := startStack(t)
	addr := strings.TrimSuffix(strings.TrimPrefix(s.BaseURL, "http://"), "/v1")
	body := chatBody
	for _, tc := range []struct {
		name, request, want string
	}{
		{"two Authorization headers",
			fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", s.Key, s.Key, len(body), body),
			"HTTP/1.1 401"},
		{"Content-Length and Transfer-Encoding together",
			fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", s.Key),
			"HTTP/1.1 400"},
		{"two different Content-Lengths",
			fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n{}{}", s.Key),
			"HTTP/1.1 400"},
		{"a bare LF inside a header value",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer kiln-x\nX-Injected: 1\r\nContent-Length: 2\r\n\r\n{}",
			"HTTP/1.1 40"},
		{"headers over 64 KiB",
			"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 80<<10) + "\r\n\r\n",
			"HTTP/1.1 431"},
		{"the key in the query string",
			"GET /v1/models?api_key=" + s.Key + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"HTTP/1.1 401"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rawExchange(t, addr, []byte(tc.request)); !strings.HasPrefix(got, tc.want) {
				t.Errorf("answer %q, want %q", got, tc.want)
			}
		})
	}
}
