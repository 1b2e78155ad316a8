// Package lambda runs the built Lambda bootstrap binaries — linux, this machine's architecture,
// built by infra/lambdabuild exactly as the arm64 release is — under an emulated Lambda Runtime
// API on loopback, and checks what AWS would see: streamed HTTP integration responses (a JSON
// prelude, eight NUL bytes, the body as it is written), function errors, and the aggregator's
// partial batch failures. It also checks template.yaml and the sample payloads in events/.
package lambda

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// integrationResponse is the content type of a streamed HTTP integration response.
const integrationResponse = "application/vnd.awslambda.http-integration-response"

// runtimeAPI emulates the Lambda Runtime API (2018-06-01) for one function process: it hands out
// queued invocations on /next and records what the function posts back, as it arrives.
type runtimeAPI struct {
	t     *testing.T
	addr  string
	queue chan *invocation

	mu        sync.Mutex
	byID      map[string]*invocation
	initError string
	seq       int
}

// invocation is one invoke and everything the function sent back for it.
type invocation struct {
	id       string
	payload  []byte
	deadline time.Time

	done chan struct{} // closed when the response or error POST has been read completely

	mu          sync.Mutex
	contentType string
	chunked     bool
	outcome     string // "response" or "error"
	raw         []byte // every byte of the POST body, prelude included
	prelude     *prelude
	delimiter   []byte // the bytes between the prelude JSON and the body
	body        []byte
	arrivals    []arrival // when each part of the body arrived
	errorType   string    // Lambda-Runtime-Function-Error-Type: /error header or streamed trailer
	errorBody   []byte
	finishedAt  time.Time
}

// prelude is the JSON head of an HTTP integration response.
type prelude struct {
	StatusCode        int                 `json:"statusCode"`
	Headers           map[string]string   `json:"headers"`
	MultiValueHeaders map[string][]string `json:"multiValueHeaders"`
	Cookies           []string            `json:"cookies"`
}

// arrival marks that the body had grown to size bytes at time at.
type arrival struct {
	at   time.Time
	size int
}

func startRuntimeAPI(t *testing.T) *runtimeAPI {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := &runtimeAPI{t: t, addr: ln.Addr().String(), queue: make(chan *invocation, 16), byID: map[string]*invocation{}}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return api
}

const prefix = "/2018-06-01/runtime/"

func (api *runtimeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, prefix)
	switch {
	case r.Method == http.MethodGet && path == "invocation/next":
		api.next(w, r)
	case r.Method == http.MethodPost && path == "init/error":
		b, _ := io.ReadAll(r.Body)
		api.mu.Lock()
		api.initError = r.Header.Get("Lambda-Runtime-Function-Error-Type") + " " + string(b)
		api.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	case r.Method == http.MethodPost && strings.HasPrefix(path, "invocation/"):
		id, what, _ := strings.Cut(strings.TrimPrefix(path, "invocation/"), "/")
		api.mu.Lock()
		inv := api.byID[id]
		api.mu.Unlock()
		if inv == nil {
			http.Error(w, `{"errorMessage":"unknown request id","errorType":"InvalidRequestID"}`, http.StatusBadRequest)
			return
		}
		switch what {
		case "response":
			inv.readResponse(r)
		case "error":
			inv.readError(r)
		default:
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, r)
	}
}

// next blocks until an invocation is queued, as the real /next does.
func (api *runtimeAPI) next(w http.ResponseWriter, r *http.Request) {
	var inv *invocation
	select {
	case inv = <-api.queue:
	case <-r.Context().Done():
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Lambda-Runtime-Aws-Request-Id", inv.id)
	h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(inv.deadline.UnixMilli(), 10))
	h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:kiln-test")
	h.Set("Lambda-Runtime-Trace-Id", "Root=1-6749f3a2-0123456789abcdef01234567;Parent=0123456789abcdef;Sampled=0")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(inv.payload)
}

// invoke queues one invocation with the given time to its deadline and waits until the function
// has answered it.
func (api *runtimeAPI) invoke(t *testing.T, payload []byte, timeout time.Duration) *invocation {
	t.Helper()
	inv := api.start(payload, timeout)
	select {
	case <-inv.done:
	case <-time.After(timeout + 15*time.Second):
		t.Fatalf("invocation %s: no answer %v after its deadline", inv.id, 15*time.Second)
	}
	return inv
}

// start queues an invocation and returns at once.
func (api *runtimeAPI) start(payload []byte, timeout time.Duration) *invocation {
	api.mu.Lock()
	api.seq++
	inv := &invocation{
		id:       fmt.Sprintf("0b9f6d2c-0000-4000-8000-%012d", api.seq),
		payload:  payload,
		deadline: time.Now().Add(timeout),
		done:     make(chan struct{}),
	}
	api.byID[inv.id] = inv
	api.mu.Unlock()
	api.queue <- inv
	return inv
}

var nulDelimiter = make([]byte, 8)

// readResponse reads a /response POST as it arrives. A streamed HTTP integration response is
// split into its prelude, the eight NUL bytes and the body, each part of the body timestamped.
func (inv *invocation) readResponse(r *http.Request) {
	defer close(inv.done)
	inv.mu.Lock()
	inv.outcome = "response"
	inv.contentType = r.Header.Get("Content-Type")
	inv.chunked = len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked"
	streamed := inv.contentType == integrationResponse
	inv.mu.Unlock()

	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		now := time.Now()
		if n > 0 {
			inv.mu.Lock()
			inv.raw = append(inv.raw, buf[:n]...)
			if streamed {
				if inv.prelude == nil {
					if i := bytes.Index(inv.raw, nulDelimiter); i >= 0 {
						var p prelude
						if json.Unmarshal(inv.raw[:i], &p) == nil {
							inv.prelude = &p
						} else {
							inv.prelude = &prelude{StatusCode: -1}
						}
						inv.delimiter = inv.raw[i : i+8]
						inv.body = append([]byte(nil), inv.raw[i+8:]...)
					}
				} else {
					inv.body = append(inv.body, buf[:n]...)
				}
				if inv.prelude != nil {
					inv.arrivals = append(inv.arrivals, arrival{at: now, size: len(inv.body)})
				}
			} else {
				inv.body = inv.raw
			}
			inv.mu.Unlock()
		}
		if err != nil {
			break
		}
	}
	inv.mu.Lock()
	inv.errorType = r.Trailer.Get("Lambda-Runtime-Function-Error-Type")
	if b := r.Trailer.Get("Lambda-Runtime-Function-Error-Body"); b != "" {
		inv.errorBody = []byte(b)
	}
	inv.finishedAt = time.Now()
	inv.mu.Unlock()
}

// readError reads an /error POST: the invocation failed as a whole.
func (inv *invocation) readError(r *http.Request) {
	defer close(inv.done)
	b, _ := io.ReadAll(r.Body)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.outcome = "error"
	inv.contentType = r.Header.Get("Content-Type")
	inv.errorType = r.Header.Get("Lambda-Runtime-Function-Error-Type")
	if inv.errorType == "" {
		// aws-lambda-go names the type only in the body: {"errorMessage", "errorType"}.
		var e struct {
			Type string `json:"errorType"`
		}
		_ = json.Unmarshal(b, &e)
		inv.errorType = e.Type
	}
	inv.errorBody = b
	inv.finishedAt = time.Now()
}

// sseEvent is one server-sent event of a streamed body and when its last byte arrived.
type sseEvent struct {
	data string // the data: field; "" for a comment
	at   time.Time
}

// events splits the body into server-sent events, each stamped with the arrival of its end.
func (inv *invocation) events() []sseEvent {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var out []sseEvent
	start := 0
	for {
		i := bytes.Index(inv.body[start:], []byte("\n\n"))
		if i < 0 {
			return out
		}
		end := start + i + 2
		ev := sseEvent{at: inv.arrivalOf(end)}
		for _, line := range strings.Split(string(inv.body[start:end]), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				ev.data = d
			}
		}
		out = append(out, ev)
		start = end
	}
}

// arrivalOf is when the body first reached n bytes.
func (inv *invocation) arrivalOf(n int) time.Time {
	for _, a := range inv.arrivals {
		if a.size >= n {
			return a.at
		}
	}
	return inv.finishedAt
}
