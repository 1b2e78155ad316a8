package lambda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/tests/internal/output"
)

var (
	repoRoot string
	binDir   string // <binDir>/<function>/bootstrap
)

// TestMain builds both functions once, through infra/lambdabuild — the tool behind the release
// zips and sam build — for linux on this machine's architecture.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		wd, _ := os.Getwd()
		repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
		dir, err := os.MkdirTemp("", "kiln-lambda-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, fn := range []string{"gateway", "aggregator"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command("go", "run", "./infra/lambdabuild", "-arch", runtime.GOARCH, "-dir", filepath.Join(dir, fn), "./functions/"+fn)
				cmd.Dir = repoRoot
				if out, err := cmd.CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("build %s: %v\n%s", fn, err, out)
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return m.Run()
	}())
}

// function is one running bootstrap process attached to its own emulated Runtime API.
type function struct {
	api    *runtimeAPI
	cmd    *exec.Cmd
	stderr *output.Buffer
}

// startFunction runs the built bootstrap of fn with the environment Lambda gives a function
// (and nothing of the test's own), plus env.
func startFunction(t *testing.T, fn string, env ...string) *function {
	t.Helper()
	api := startRuntimeAPI(t)
	task := filepath.Join(binDir, fn)
	cmd := exec.Command(filepath.Join(task, "bootstrap"))
	cmd.Dir = task
	cmd.Env = append([]string{
		"AWS_LAMBDA_RUNTIME_API=" + api.addr,
		"AWS_LAMBDA_FUNCTION_NAME=kiln-test-" + fn,
		"AWS_LAMBDA_FUNCTION_VERSION=$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=1024",
		"AWS_LAMBDA_LOG_GROUP_NAME=/aws/lambda/kiln-test-" + fn,
		"AWS_REGION=us-east-1",
		"LAMBDA_TASK_ROOT=" + task,
		"_HANDLER=bootstrap",
		"TZ=:UTC",
	}, env...)
	f := &function{api: api, cmd: cmd, stderr: &output.Buffer{}}
	cmd.Stdout, cmd.Stderr = f.stderr, f.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s output:\n%s", fn, f.stderr.String())
		}
	})
	return f
}

// invoke sends one event with the given time to the invocation deadline.
func (f *function) invoke(t *testing.T, payload []byte, deadline time.Duration) *invocation {
	t.Helper()
	return f.api.invoke(t, payload, deadline)
}
