package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLinksEveryGatewayFile: the profiled gateway is functions/gateway's own files; a file added
// there and not linked here would leave gatewayprof a different program, or none.
func TestLinksEveryGatewayFile(t *testing.T) {
	gateway := filepath.Join("..", "..", "..", "..", "functions", "gateway")
	files, err := filepath.Glob(filepath.Join(gateway, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("functions/gateway: %v %v", files, err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		target, err := os.Readlink(name)
		if err != nil || filepath.Clean(target) != filepath.Clean(f) {
			t.Errorf("%s: want a link to %s (ln -s %s %s), have %q (%v)", name, f, f, name, target, err)
		}
	}
}
