package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// localServer is serve in this process, with the simulator, on a fresh data directory.
type localServer struct {
	cfg       config.Config
	base, key string
	logs      *syncBuffer  // warnings and errors
	stop      func() error // ends serve as SIGTERM does, and returns what it returned
}

func startLocal(t testing.TB, extra map[string]string) *localServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sim := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	catalogFile := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(catalogFile, bytes.ReplaceAll(catalog.ReferenceYAML(), []byte(catalog.ReferenceSimulator), []byte(sim)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KILN_ADDR": "127.0.0.1:0", "KILN_DATA_DIR": filepath.Join(dir, "data"),
		"KILN_CATALOG": catalogFile, "KILN_SIMULATOR_ADDR": sim}
	for k, v := range extra {
		env[k] = v
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := &syncBuffer{}, &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, cfg, func(k string) string { return env[k] }, log, out)
	}()
	var stopped bool
	var runErr error
	l := &localServer{cfg: cfg, logs: logs, stop: func() error {
		if !stopped {
			stopped = true
			cancel()
			runErr = <-done
		}
		return runErr
	}}
	t.Cleanup(func() { l.stop() })
	for deadline := time.Now().Add(30 * time.Second); l.base == "" || l.key == ""; time.Sleep(10 * time.Millisecond) {
		if m := regexp.MustCompile(`listening on (http://\S+/v1)`).FindStringSubmatch(out.String()); m != nil {
			l.base = m[1]
		}
		if m := regexp.MustCompile(`export KILN_API_KEY=(\S+)`).FindStringSubmatch(out.String()); m != nil {
			l.key = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not start:\n%s", out.String())
		}
	}
	return l
}

// TestInProcessAggregates: on the embedded store (make run), a request's usage event is folded
// into the store's aggregates at settlement.
func TestInProcessAggregates(t *testing.T) {
	l := startLocal(t, nil)
	defer func() {
		if err := l.stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	base, key, cfg := l.base, l.key, l.cfg
	req, _ := http.NewRequest(http.MethodPost, base+"/chat/completions", strings.NewReader(
		`{"model": "qwen3-32b", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}

	st, err := sqlite.Open(cfg.DataDir, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	day := time.Now().UTC().Format(time.DateOnly)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rs, err := st.DailyRollups(t.Context(), demoOrgID, day, day)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 1 && rs[0].Requests == 1 && rs[0].CompletionTokens == 5 && rs[0].Cost > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("aggregates %+v; want the request folded", rs)
		}
	}
}

// TestShutdownPastTheGrace: a stream still open when the shutdown grace ends is cut, and settled,
// before serve returns: the request is in the store with what it generated.
func TestShutdownPastTheGrace(t *testing.T) {
	l := startLocal(t, map[string]string{"KILN_SHUTDOWN_GRACE": "300ms"})
	req, _ := http.NewRequest(http.MethodPost, l.base+"/chat/completions", strings.NewReader(
		`{"model": "qwen3-32b", "messages": [{"role": "user", "content": "slow [[sim:delay_ms=200]]"}], "max_tokens": 100, "stream": true}`))
	req.Header.Set("Authorization", "Bearer "+l.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	gen := resp.Header.Get("X-Neocloud-Generation-Id")
	if resp.StatusCode != http.StatusOK || gen == "" {
		t.Fatalf("status %d, generation %q", resp.StatusCode, gen)
	}
	r := bufio.NewReader(resp.Body)
	for { // the stream has delivered a token (the first event is the role's alone)
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":"tok`) {
			break
		}
	}
	go io.Copy(io.Discard, r)
	if err := l.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	st, err := sqlite.Open(l.cfg.DataDir, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ev, err := st.Generation(t.Context(), demoOrgID, gen)
	if err != nil {
		t.Fatalf("the stream cut at shutdown was not settled: %v", err)
	}
	if ev.CompletionTokens <= 0 || ev.CompletionTokens >= 100 {
		t.Errorf("settled with %d completion tokens; want what was generated before the cut", ev.CompletionTokens)
	}
}

// TestReferenceCatalogFollowsTheSimulator: with the reference catalog (KILN_CATALOG unset), the
// simulator started elsewhere than the catalog file's 127.0.0.1:8090 serves every model, and
// nothing is logged against it.
func TestReferenceCatalogFollowsTheSimulator(t *testing.T) {
	l := startLocal(t, map[string]string{"KILN_CATALOG": ""})
	if l.cfg.Simulator == catalog.ReferenceSimulator {
		t.Fatalf("the simulator is on the reference address %s; the test needs it elsewhere", l.cfg.Simulator)
	}
	for _, model := range []string{"qwen3-32b", "gpt-oss-120b"} {
		req, _ := http.NewRequest(http.MethodPost, l.base+"/chat/completions", strings.NewReader(
			`{"model": "`+model+`", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}`))
		req.Header.Set("Authorization", "Bearer "+l.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "tok0 tok1 tok2") {
			t.Errorf("%s: %d %s; want the simulator on %s to answer", model, resp.StatusCode, body, l.cfg.Simulator)
		}
	}
	if logs := l.logs.String(); logs != "" {
		t.Errorf("warnings:\n%s", logs)
	}
}

// TestCatalogAwayFromTheSimulatorWarns: a copy of the reference catalog keeps its backends on
// 127.0.0.1:8090 while the simulator runs elsewhere; requests would go to whatever listens there,
// so the gateway warns that the simulator serves no model.
func TestCatalogAwayFromTheSimulatorWarns(t *testing.T) {
	file := filepath.Join(t.TempDir(), "catalog.yaml")
	if err := os.WriteFile(file, catalog.ReferenceYAML(), 0o600); err != nil {
		t.Fatal(err)
	}
	l := startLocal(t, map[string]string{"KILN_CATALOG": file})
	logs := l.logs.String()
	for _, want := range []string{`"level":"WARN"`, "the model simulator serves no model", `"addr":"` + l.cfg.Simulator + `"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}
