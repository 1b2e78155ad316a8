// Package e2e runs the built binaries — the gateway with its model simulator, and kilnctl — and
// drives them with clients nobody here wrote: openai-go and the official openai npm package.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/catalog"
	"github.com/neocloud/kiln/tests/internal/build"
	"github.com/neocloud/kiln/tests/internal/output"
)

var (
	binDir     string
	gatewayBin string
	kilnctlBin string
	repoRoot   string
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "kiln-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		if repoRoot, err = build.Repo(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bins, err := build.Commands(dir, "./functions/gateway", "./infra/kilnctl")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		gatewayBin, kilnctlBin = bins[0], bins[1]
		return m.Run()
	}())
}

// stack is one running gateway process with its simulator and data directory.
type stack struct {
	BaseURL string // ends in /v1
	Key     string // the demo organization's key
	DataDir string
	Env     []string

	cmd    *exec.Cmd
	stdout *output.Buffer
	stderr *output.Buffer
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

var (
	listenLine = regexp.MustCompile(`listening on (http://\S+/v1)`)
	keyLine    = regexp.MustCompile(`export KILN_API_KEY=(kiln-[A-Za-z0-9]+)`)
)

// startStack starts the gateway binary as `make run` does, on free ports, with the reference
// catalog pointed at its own simulator port, and extra environment on top.
func startStack(t *testing.T, extraEnv ...string) *stack {
	t.Helper()
	dir := t.TempDir()
	simAddr := freePort(t)
	catalogPath := filepath.Join(dir, "catalog.yaml")
	cat := strings.ReplaceAll(string(catalog.ReferenceYAML()), "127.0.0.1:8090", simAddr)
	if err := os.WriteFile(catalogPath, []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &stack{DataDir: filepath.Join(dir, "data"), stdout: &output.Buffer{}, stderr: &output.Buffer{}}
	s.Env = append([]string{
		"KILN_ADDR=127.0.0.1:0",
		"KILN_SIMULATOR_ADDR=" + simAddr,
		"KILN_CATALOG=" + catalogPath,
		"KILN_DATA_DIR=" + s.DataDir,
		"KILN_SHUTDOWN_GRACE=2s",
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
	}, extraEnv...)
	s.start(t)
	return s
}

func (s *stack) start(t *testing.T) {
	t.Helper()
	s.cmd = exec.Command(gatewayBin)
	s.cmd.Env = s.Env
	pr, pw := io.Pipe()
	s.cmd.Stdout = io.MultiWriter(s.stdout, pw)
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop(t) })
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if m := listenLine.FindStringSubmatch(line); m != nil {
				s.BaseURL = m[1]
			}
			if m := keyLine.FindStringSubmatch(line); m != nil {
				s.Key = m[1]
			}
			if strings.HasPrefix(line, "OpenAI SDKs:") {
				close(found)
				_, _ = io.Copy(io.Discard, pr)
				return
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(20 * time.Second):
		t.Fatalf("gateway did not start:\nstdout:\n%s\nstderr:\n%s", s.stdout, s.stderr)
	}
	if s.BaseURL == "" {
		t.Fatalf("no listen address in the banner:\n%s", s.stdout)
	}
	resp, err := http.Get(strings.TrimSuffix(s.BaseURL, "/v1") + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
}

func (s *stack) stop(t *testing.T) {
	if s.cmd == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("gateway exited with %v; stderr:\n%s", err, s.stderr)
		}
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
		t.Errorf("gateway did not stop on SIGTERM")
	}
}

// kilnctl runs the built kilnctl against the stack's data directory.
func (s *stack) kilnctl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(kilnctlBin, args...)
	cmd.Env = s.Env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kilnctl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// post sends a raw request to the gateway.
func (s *stack) post(t *testing.T, ctx context.Context, path, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.BaseURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
