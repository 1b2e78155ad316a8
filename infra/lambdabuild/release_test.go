package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckRelease(t *testing.T) {
	write := func(url string) string {
		t.Helper()
		ref, err := os.ReadFile(filepath.Join("..", "catalog.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "catalog.yaml")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(ref), "http://127.0.0.1:8090/v1", url)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	ref := filepath.Join("..", "catalog.yaml")
	for _, tc := range []struct {
		name, path, errHas string
	}{
		{"the reference catalog", ref, "127.0.0.1:8090/v1 is a loopback address"},
		{"private network", write("http://10.0.0.5:8000/v1"), ""},
		{"a name", write("https://models.internal.example.com/v1"), ""},
		{"localhost", write("http://localhost:8000/v1"), "a loopback name"},
		{"IPv6 loopback", write("http://[::1]:8000/v1"), "a loopback address"},
		{"link-local", write("http://169.254.10.20:8000/v1"), "a link-local address"},
		{"IPv6 link-local", write("http://[fe80::1]:8000/v1"), "a link-local address"},
		{"unspecified", write("http://0.0.0.0:8000/v1"), "the unspecified address"},
		{"no catalog", "", "no catalog"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkRelease(tc.path)
			switch {
			case tc.errHas == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
				t.Errorf("error %v, want one mentioning %q", err, tc.errHas)
			case tc.errHas != "" && tc.path != "" && !strings.Contains(err.Error(), "LAMBDA_CATALOG=") || err != nil && tc.path != "" && !strings.Contains(err.Error(), tc.path):
				t.Errorf("error %v: want it to name the catalog and how to give the real one", err)
			}
		})
	}
}

// TestSamBuildRefusesTheDemoCatalog runs the Makefile's target the way sam build does (make
// build-GatewayFunction ARTIFACTS_DIR=...): with the default LAMBDA_CATALOG it fails, naming the
// catalog and LAMBDA_CATALOG, and writes no bootstrap.
func TestSamBuildRefusesTheDemoCatalog(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("make", "-s", "-C", filepath.Join("..", ".."), "build-GatewayFunction", "ARTIFACTS_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make build-GatewayFunction with the demo catalog succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "infra/catalog.yaml has backends a Lambda function cannot reach") || !strings.Contains(string(out), "LAMBDA_CATALOG=") {
		t.Errorf("make build-GatewayFunction said:\n%s\nwant the catalog named and how to give the real one", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "bootstrap")); err == nil {
		t.Error("a bootstrap was built anyway")
	}
}
