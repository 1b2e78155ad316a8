package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBinaryWiresRun builds kilnctl and runs it once, to prove that main passes the arguments,
// the environment and the output streams to run.
func TestBinaryWiresRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Skip("no go tool")
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kilnctl")
	build := exec.Command(goTool, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	data := filepath.Join(dir, "data")
	cmd := exec.Command(bin, "org", "create", "--name", "From the binary", "--json")
	// The parent's KILN_* and Lambda variables must not choose another store.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KILN_") && !strings.HasPrefix(kv, "AWS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "KILN_STORE=sqlite", "KILN_DATA_DIR="+data)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kilnctl org create: %v\nstderr: %s", err, stderr.String())
	}
	var created orgJSON
	if err := json.Unmarshal(out, &created); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if created.Name != "From the binary" || !generatedOrgID.MatchString(created.ID) {
		t.Fatalf("created %+v", created)
	}

	// The binary wrote to KILN_DATA_DIR: run finds the organization there.
	e := &testEnv{t: t, vars: map[string]string{"KILN_STORE": "sqlite", "KILN_DATA_DIR": data}}
	var again orgShowJSON
	e.json(&again, "org", "show", created.ID)
	if again.ID != created.ID || again.Name != created.Name {
		t.Fatalf("org show: %+v", again)
	}
}
