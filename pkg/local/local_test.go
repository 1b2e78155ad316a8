package local

import (
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

	"github.com/neocloud/kiln/infra"
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

// TestInProcessAggregates: without an event bus (make run), a request's usage event is folded
// into the embedded store's aggregates, at settlement, and never left unpublished.
func TestInProcessAggregates(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sim := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	catalog := filepath.Join(dir, "catalog.yaml")
	if err := os.WriteFile(catalog, bytes.ReplaceAll(infra.ReferenceCatalog, []byte("127.0.0.1:8090"), []byte(sim)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KILN_ADDR": "127.0.0.1:0", "KILN_DATA_DIR": filepath.Join(dir, "data"),
		"KILN_CATALOG": catalog, "KILN_SIMULATOR_ADDR": sim}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, func(k string) string { return env[k] }, slog.New(slog.DiscardHandler), out)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var base, key string
	for deadline := time.Now().Add(30 * time.Second); base == "" || key == ""; time.Sleep(10 * time.Millisecond) {
		if m := regexp.MustCompile(`listening on (http://\S+/v1)`).FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
		if m := regexp.MustCompile(`export KILN_API_KEY=(\S+)`).FindStringSubmatch(out.String()); m != nil {
			key = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not start:\n%s", out.String())
		}
	}
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

	st, err := sqlite.Open(cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	day := time.Now().UTC().Format(time.DateOnly)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rs, err := st.DailyRollups(t.Context(), DemoOrgID, day, day)
		if err != nil {
			t.Fatal(err)
		}
		left, err := st.Unpublished(t.Context(), time.Now().Add(time.Hour), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 1 && rs[0].Requests == 1 && rs[0].CompletionTokens == 5 && rs[0].Cost > 0 && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("aggregates %+v, %d unpublished; want the request folded and published", rs, len(left))
		}
	}
}
