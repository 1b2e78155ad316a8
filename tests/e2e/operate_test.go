package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// errorBody decodes a gateway error.
func errorBody(t *testing.T, resp *http.Response) (status int, code string) {
	t.Helper()
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("status %d, not a JSON error: %s", resp.StatusCode, b)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return resp.StatusCode, code
}

// eventually retries check until it returns true, for at most 5 s: the time within which the
// contract says operators' changes reach a running gateway.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if check() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s did not reach the running gateway within 5 s", what)
}

const chatBody = `{"model":"qwen3-32b","messages":[{"role":"user","content":"Hello!"}],"max_tokens":4}`

// TestOperatorsChangesReachTheGateway runs kilnctl against the data directory of a running
// gateway, as an operator would, and checks each change takes effect within 5 s.
func TestOperatorsChangesReachTheGateway(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()

	var org struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(s.kilnctl(t, "org", "create", "--name", "Acme", "--max-in-flight", "2", "--json")), &org); err != nil {
		t.Fatal(err)
	}
	var key struct {
		Key string `json:"key"`
		ID  string `json:"id"`
	}
	if err := json.Unmarshal([]byte(s.kilnctl(t, "key", "create", "--org", org.ID, "--json")), &key); err != nil {
		t.Fatal(err)
	}

	// No credits yet: 402.
	if st, code := errorBody(t, s.post(t, ctx, "/chat/completions", key.Key, chatBody)); st != 402 || code != "insufficient_credits" {
		t.Fatalf("new organization: %d %s, want 402 insufficient_credits", st, code)
	}
	s.kilnctl(t, "credits", "add", "--org", org.ID, "--usd", "0.50")
	eventually(t, "a top-up", func() bool {
		resp := s.post(t, ctx, "/chat/completions", key.Key, chatBody)
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	s.kilnctl(t, "org", "suspend", org.ID)
	eventually(t, "a suspension", func() bool {
		st, code := errorBody(t, s.post(t, ctx, "/chat/completions", key.Key, chatBody))
		return st == 403 && code == "organization_suspended"
	})
	s.kilnctl(t, "org", "resume", org.ID)
	eventually(t, "a resumption", func() bool {
		resp := s.post(t, ctx, "/chat/completions", key.Key, chatBody)
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	s.kilnctl(t, "maintenance", "on", "--until", until.Format(time.RFC3339))
	eventually(t, "maintenance", func() bool {
		resp := s.post(t, ctx, "/chat/completions", key.Key, chatBody)
		ra := resp.Header.Get("Retry-After")
		st, code := errorBody(t, resp)
		return st == 503 && code == "maintenance" && ra == until.Format(http.TimeFormat)
	})
	s.kilnctl(t, "maintenance", "off")
	eventually(t, "the end of maintenance", func() bool {
		resp := s.post(t, ctx, "/chat/completions", key.Key, chatBody)
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	s.kilnctl(t, "key", "revoke", key.ID)
	eventually(t, "a revocation", func() bool {
		st, code := errorBody(t, s.post(t, ctx, "/chat/completions", key.Key, chatBody))
		return st == 401 && code == "invalid_api_key"
	})

	// The ledger holds the top-up and one debit per successful request, and the balance is
	// their exact sum.
	var ledger []struct {
		Kind   string `json:"kind"`
		Amount string `json:"amount"`
	}
	out := s.kilnctl(t, "credits", "ledger", "--org", org.ID, "--json")
	if err := json.Unmarshal([]byte(out), &ledger); err != nil {
		var wrapped struct {
			Entries json.RawMessage `json:"entries"`
		}
		if json.Unmarshal([]byte(out), &wrapped) != nil || json.Unmarshal(wrapped.Entries, &ledger) != nil {
			t.Fatalf("ledger --json: %v\n%s", err, out)
		}
	}
	debits := 0
	for _, e := range ledger {
		if e.Kind == "debit" {
			debits++
			if !strings.HasPrefix(e.Amount, "-0.00000") {
				t.Errorf("debit %s: want a small negative exact amount", e.Amount)
			}
		}
	}
	if debits < 3 {
		t.Errorf("%d debits in the ledger, want one per successful request (at least 3):\n%s", debits, out)
	}
}

// TestRestartKeepsState restarts the gateway on the same data directory: the demo key still
// works, no second demo organization is made, and the banner says so.
func TestRestartKeepsState(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	resp := s.post(t, ctx, "/chat/completions", s.Key, chatBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("first run: %d", resp.StatusCode)
	}
	key := s.Key
	s.stop(t)
	s.Key = ""
	s.start(t)
	if s.Key != "" {
		t.Fatal("a second demo key was printed on restart")
	}
	if !strings.Contains(s.stdout.String(), "existing organizations") {
		t.Errorf("the banner does not say the store was reused:\n%s", s.stdout)
	}
	resp = s.post(t, ctx, "/chat/completions", key, chatBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after restart: %d", resp.StatusCode)
	}
	if n := strings.Count(s.kilnctl(t, "org", "list", "--json"), `"id"`); n != 1 {
		t.Errorf("%d organizations after restart, want 1", n)
	}
}

// TestShutdownSettlesOpenStreams sends SIGTERM while a stream is open: the stream is allowed to
// finish within the grace period, and its usage is recorded.
func TestShutdownSettlesOpenStreams(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	body := `{"model":"qwen3-32b","stream":true,"messages":[{"role":"user","content":"slow [[sim:delay_ms=100]]"}],"max_tokens":8}`
	resp := s.post(t, ctx, "/chat/completions", s.Key, body)
	defer resp.Body.Close()
	gen := resp.Header.Get("X-Neocloud-Generation-Id")
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { s.stop(t); close(stopped) }()
	rest, _ := io.ReadAll(r)
	if !strings.Contains(string(rest), "data: [DONE]") {
		t.Errorf("the open stream was cut by the shutdown:\n%s", rest)
	}
	<-stopped
	if !strings.Contains(s.stderr.String(), gen) {
		t.Errorf("no settlement logged for %s", gen)
	}
	out := s.kilnctl(t, "usage", "--org", "org_demo", "--from", time.Now().UTC().Format("2006-01-02"), "--to", time.Now().UTC().Format("2006-01-02"), "--json")
	if !strings.Contains(out, gen) {
		t.Errorf("usage has no event %s:\n%s", gen, out)
	}
}
