package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// lambdaCold is the Lambda bootstrap's cold start on each store.
type lambdaCold struct {
	Dynamo, SQLite lambdaTimes
	Err            error
	// memory is the bootstrap on DynamoDB at each memory size with its CPU limited as Lambda
	// limits it (measureLambdaMemory).
	memory lambdaMemory
}

// lambdaTimes are a store's starts of the bootstrap, in ms, one per round: Init from exec until
// it first asked for an invocation, Cold from exec until the first invocation's 200 response had
// arrived whole, and Warm the second invocation's, from being queued to the end of its response.
type lambdaTimes struct{ Init, Cold, Warm spread }

// measureLambdaColdStart builds the gateway's bootstrap as the release is built, and times, on
// DynamoDB (DynamoDB Local, seeded through kilnctl) and on the run's embedded store, exec to the
// end of the first invocation's 200 response under a loopback Runtime API (see lambdaTimes).
// The first start on each store is not counted: it warms DynamoDB Local's JVM, which on AWS is
// always warm. Then it compares the memory sizes on DynamoDB (measureLambdaMemory).
func measureLambdaColdStart(st *stack, repo string, rounds int) (c lambdaCold) {
	task, err := st.lambdaTask(repo)
	if err != nil {
		c.Err = err
		return c
	}
	// A store the bootstrap runs on, holding the benchmark's organization.
	type store struct {
		name  string
		env   []string // KILN_STORE and where the store is
		key   string
		times *lambdaTimes
	}
	stores := []store{{name: "sqlite", key: st.key, times: &c.SQLite,
		env: []string{"KILN_STORE=sqlite", "KILN_DATA_DIR=" + filepath.Join(st.dir, "data")}}}
	ddb, env, key, err := onDynamoDBLocal(st, lambdaTablePrefix)
	if ddb != nil {
		defer ddb.Stop()
	}
	if err == nil {
		stores = append([]store{{name: "dynamodb", key: key, times: &c.Dynamo, env: env}}, stores...)
	} else {
		c.Err = fmt.Errorf("Lambda bootstrap on DynamoDB Local: %w", err)
	}

	body := st.gateway.body(nonStreaming)
	for r := -1; r < rounds; r++ {
		for _, s := range alternate(r, stores) {
			event, err := functionURLEvent(repo, s.key, body)
			if err != nil {
				c.Err = err
				return c
			}
			// The first invocation is cold; a second one of the same event is warm. The process
			// is then killed, as Lambda ends an execution environment.
			b, first, err := startBootstrap(task, s.env, nil, event, filepath.Join(st.dir, fmt.Sprintf("cold-lambda-%s-%d.log", s.name, r+1)))
			if err != nil {
				c.Err = fmt.Errorf("Lambda bootstrap on %s: %w", s.name, err)
				return c
			}
			queued, warm, err := b.invoke(event)
			b.stop()
			if err != nil {
				c.Err = fmt.Errorf("Lambda bootstrap on %s: %w", s.name, err)
				return c
			}
			if r >= 0 {
				s.times.Init = append(s.times.Init, ms(b.inited.Sub(b.started)))
				s.times.Cold = append(s.times.Cold, ms(first.at.Sub(b.started)))
				s.times.Warm = append(s.times.Warm, ms(warm.at.Sub(queued)))
			}
		}
	}
	if len(stores) > 1 && c.Err == nil {
		c.memory = measureLambdaMemory(st, repo, task, ddb.Endpoint, key, env, rounds)
	}
	return c
}

// lambdaTask is the directory of the gateway's bootstrap with the run's catalog beside it,
// built the first time through infra/lambdabuild, as `make build-lambda` and sam build do, but
// for this machine's architecture.
func (st *stack) lambdaTask(repo string) (string, error) {
	task := filepath.Join(st.dir, "lambda")
	if _, err := os.Stat(filepath.Join(task, "bootstrap")); err == nil {
		return task, nil
	}
	cmd := exec.Command("go", "run", "./infra/lambdabuild", "-arch", runtime.GOARCH, "-dir", task, "-catalog", filepath.Join(st.dir, "catalog.yaml"), "./functions/gateway")
	cmd.Dir = repo
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("lambdabuild ./functions/gateway: %v\n%s", err, b)
	}
	return task, nil
}

// functionURLEvent is the recorded function URL event of events/ carrying a chat completion.
func functionURLEvent(repo, key string, body []byte) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(repo, "events", "function-url-request.json"))
	if err != nil {
		return nil, err
	}
	var ev events.LambdaFunctionURLRequest
	if err := json.Unmarshal(b, &ev); err != nil {
		return nil, fmt.Errorf("events/function-url-request.json: %w", err)
	}
	ev.RawPath, ev.RequestContext.HTTP.Path = "/v1/chat/completions", "/v1/chat/completions"
	ev.RequestContext.HTTP.Method = http.MethodPost
	if ev.Headers == nil {
		ev.Headers = map[string]string{}
	}
	ev.Headers["authorization"] = "Bearer " + key
	ev.Headers["content-type"] = "application/json"
	ev.Headers["accept"] = "application/json"
	if bytes.Contains(body, []byte(`"stream":true`)) {
		ev.Headers["accept"] = "text/event-stream"
	}
	ev.Body, ev.IsBase64Encoded = string(body), false
	return json.Marshal(ev)
}

// bootstrap is the gateway's bootstrap running under a loopback Lambda Runtime API (2018-06-01),
// as in one Lambda execution environment: it serves one invocation at a time. Its ServeHTTP is
// that API: invocation/next hands out the queued invocations one by one (and blocks while none
// is queued, as the real one does between invocations), and each invocation's response is read
// to its end as it streams in.
type bootstrap struct {
	srv     *httptest.Server
	queue   chan invocation
	asked   chan time.Time // when the function first asked for an invocation: its init had ended
	ended   chan invocationEnd
	cmd     *exec.Cmd
	logPath string
	started time.Time     // when it was executed
	inited  time.Time     // when it first asked for an invocation: its init had ended
	exited  chan struct{} // closed when it has exited
	mu      sync.Mutex    // one invocation at a time, as Lambda sends them to an environment
	n       int           // invocations so far
}

// startBootstrap execs the bootstrap in task with the environment Lambda gives a function plus
// env, and returns once it has answered first, its first invocation. With a limit, the process
// is in that cgroup from its first instruction (a shell puts itself there and execs the
// bootstrap), so that its init runs under the limit and the Go runtime sees it as it would on
// Lambda.
func startBootstrap(task string, env []string, limit *cpuLimit, first []byte, logPath string) (*bootstrap, invocationEnd, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, invocationEnd{}, err
	}
	b := &bootstrap{queue: make(chan invocation, 1), asked: make(chan time.Time, 1), ended: make(chan invocationEnd, 4),
		logPath: logPath, exited: make(chan struct{}), n: 1}
	b.srv = httptest.NewServer(b)
	defer logf.Close() // the child holds its own descriptor
	bin := filepath.Join(task, "bootstrap")
	cmd := exec.Command(bin)
	if limit != nil {
		cmd = exec.Command("/bin/sh", "-c", `echo $$ > "$1" && exec "$2"`, "sh", limit.procs(), bin)
	}
	cmd.Dir = task
	// Later entries of env win: AWS_LAMBDA_FUNCTION_MEMORY_SIZE among them.
	cmd.Env = append([]string{
		"AWS_LAMBDA_RUNTIME_API=" + b.srv.Listener.Addr().String(),
		"AWS_LAMBDA_FUNCTION_NAME=kiln-bench-gateway",
		"AWS_LAMBDA_FUNCTION_VERSION=$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=1024",
		"AWS_LAMBDA_LOG_GROUP_NAME=/aws/lambda/kiln-bench-gateway",
		"AWS_REGION=us-east-1",
		"LAMBDA_TASK_ROOT=" + task,
		"_HANDLER=bootstrap",
		"TZ=:UTC",
		"KILN_CATALOG=" + filepath.Join(task, "catalog.yaml"), // as template.yaml sets it
	}, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	b.cmd = cmd
	b.queue <- invocation{id: requestID(1), event: first}
	b.started = time.Now()
	if err := cmd.Start(); err != nil {
		b.srv.Close()
		return nil, invocationEnd{}, err
	}
	go func() { _ = cmd.Wait(); close(b.exited) }()
	end, err := b.wait(requestID(1))
	if err != nil {
		b.stop()
		return nil, end, err
	}
	b.inited = <-b.asked
	return b, end, nil
}

func (b *bootstrap) pid() int { return b.cmd.Process.Pid }

// invoke queues event as the next invocation and returns, when its response has arrived whole,
// when the invocation was queued and how its response ended.
func (b *bootstrap) invoke(event []byte) (queued time.Time, end invocationEnd, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	id := requestID(b.n)
	queued = time.Now()
	b.queue <- invocation{id: id, event: event}
	end, err = b.wait(id)
	return queued, end, err
}

// wait returns how the response of invocation id ended, once it has arrived whole.
func (b *bootstrap) wait(id string) (invocationEnd, error) {
	select {
	case e := <-b.ended:
		if e.err == nil && e.id != id {
			e.err = fmt.Errorf("a response for invocation %s, want %s", e.id, id)
		}
		if e.err != nil {
			return invocationEnd{}, fmt.Errorf("%w; its log:\n%s", e.err, tail(b.logPath))
		}
		return e, nil
	case <-b.exited:
		return invocationEnd{}, fmt.Errorf("bootstrap exited (%v) before answering; its log:\n%s", b.cmd.ProcessState, tail(b.logPath))
	case <-time.After(10 * time.Second):
		return invocationEnd{}, fmt.Errorf("bootstrap: no response within 10 s; its log:\n%s", tail(b.logPath))
	}
}

// stop kills the process, as Lambda ends an execution environment, and closes the Runtime API.
func (b *bootstrap) stop() {
	_ = b.cmd.Process.Kill()
	<-b.exited
	b.srv.Close()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// tail is the end of a log file, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return string(b)
}

type invocation struct {
	id    string
	event []byte
}

// invocationEnd is how an invocation ended: when the last byte of its response arrived, and why
// it is not a whole 200 response if it is not.
type invocationEnd struct {
	id    string
	first time.Time // when the body's first data: event arrived (zero when there was none)
	at    time.Time
	err   error
}

const (
	runtimePrefix = "/2018-06-01/runtime/"
	// integrationResponse is the content type of a streamed HTTP integration response: a JSON
	// prelude with the status and headers, eight NUL bytes, then the body.
	integrationResponse = "application/vnd.awslambda.http-integration-response"
)

func requestID(n int) string { return fmt.Sprintf("8f4e1c2a-0b9f-4d2c-8000-%012d", n) }

func (b *bootstrap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path, _ := strings.CutPrefix(r.URL.Path, runtimePrefix)
	id, what, _ := strings.Cut(strings.TrimPrefix(path, "invocation/"), "/")
	switch {
	case r.Method == http.MethodGet && path == "invocation/next":
		select {
		case b.asked <- time.Now():
		default: // not the first time
		}
		select {
		case inv := <-b.queue:
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("Lambda-Runtime-Aws-Request-Id", inv.id)
			h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10))
			h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:kiln-bench-gateway")
			_, _ = w.Write(inv.event)
		case <-r.Context().Done():
		}
	case r.Method == http.MethodPost && strings.HasPrefix(path, "invocation/") && what == "response":
		e := readResponse(r)
		e.id = id
		b.end(e)
		w.WriteHeader(http.StatusAccepted)
	case r.Method == http.MethodPost && (strings.HasPrefix(path, "invocation/") && what == "error" || path == "init/error"):
		msg, _ := io.ReadAll(io.LimitReader(r.Body, 4<<10))
		b.end(invocationEnd{id: id, at: time.Now(), err: fmt.Errorf("%s: %s", path, msg)})
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, r)
	}
}

// end records how an invocation ended.
func (b *bootstrap) end(e invocationEnd) {
	select {
	case b.ended <- e:
	default: // more ends than invocations: the first are what matters
	}
}

// readResponse reads a streamed HTTP integration response to its end. A function error that
// happens after the prelude was sent arrives in the trailer.
func readResponse(r *http.Request) invocationEnd {
	var e invocationEnd
	var buf bytes.Buffer
	chunk := make([]byte, 32<<10)
	var err error
	for err == nil {
		var n int
		n, err = r.Body.Read(chunk)
		buf.Write(chunk[:n])
		if e.first.IsZero() {
			if _, body, ok := bytes.Cut(buf.Bytes(), make([]byte, 8)); ok && (bytes.HasPrefix(body, []byte("data:")) || bytes.Contains(body, []byte("\ndata:"))) {
				e.first = time.Now()
			}
		}
	}
	b := buf.Bytes()
	e.at = time.Now()
	head, body, ok := bytes.Cut(b, make([]byte, 8))
	var p struct {
		StatusCode int `json:"statusCode"`
	}
	switch {
	case err != io.EOF:
		e.err = fmt.Errorf("read the response: %w", err)
	case r.Header.Get("Content-Type") != integrationResponse:
		e.err = fmt.Errorf("response of type %q, want %q: %.300s", r.Header.Get("Content-Type"), integrationResponse, b)
	case r.Trailer.Get("Lambda-Runtime-Function-Error-Type") != "":
		e.err = fmt.Errorf("function error %s: %s", r.Trailer.Get("Lambda-Runtime-Function-Error-Type"), r.Trailer.Get("Lambda-Runtime-Function-Error-Body"))
	case !ok || json.Unmarshal(head, &p) != nil:
		e.err = fmt.Errorf("no JSON prelude and eight NUL bytes in %.300q", b)
	case p.StatusCode != http.StatusOK:
		e.err = fmt.Errorf("status %d: %.300s", p.StatusCode, body)
	case len(body) == 0:
		e.err = errors.New("status 200 with an empty body")
	}
	return e
}
