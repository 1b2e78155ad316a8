package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLinksNeitherSQLiteNorTheSimulator: the aggregator is a Lambda function on DynamoDB; the
// embedded store (and its SQLite driver) and the model simulator would only make its package
// larger and its cold start slower, so nothing it imports may bring them in.
func TestLinksNeitherSQLiteNorTheSimulator(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-deps", "-tags", "lambda.norpc", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case pkg == "modernc.org/sqlite", strings.HasPrefix(pkg, "modernc.org/sqlite/"),
			pkg == "github.com/neocloud/kiln/pkg/store/sqlite", pkg == "github.com/neocloud/kiln/pkg/simulator":
			t.Errorf("the aggregator links %s", pkg)
		}
	}
}
