// Package lambdaserve serves an http.Handler on AWS Lambda with response streaming, for both ways
// a request reaches the function: a function URL with InvokeMode RESPONSE_STREAM (payload format
// 2.0) and an API Gateway REST API whose Lambda proxy integration has ResponseTransferMode
// RESPONSE_STREAM (payload format 1.0). Either way the answer goes back to the Runtime API as an
// HTTP integration response — a JSON prelude with the status and headers, eight NUL bytes, then
// the body — and every Write reaches the runtime before it returns, so a handler that writes and
// flushes event by event streams event by event.
//
// aws-lambda-go's lambdaurl does the same for function URLs alone, but its ResponseWriter is not
// an http.Flusher: a handler that flushes (as every SSE relay must) sees http.ErrNotSupported
// and takes the client for gone. This package answers Flush, serves both payload formats from
// one function, and turns a handler's panic into a function error instead of a crashed process.
package lambdaserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/aws/aws-lambda-go/events"
)

// Handler adapts an http.Handler to a streaming Lambda handler. Pass its Invoke method to
// lambda.StartHandlerFunc; build with -tags lambda.norpc.
type Handler struct {
	h   http.Handler
	log *slog.Logger
}

// New returns a Handler serving h. A nil log discards.
func New(h http.Handler, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{h: h, log: log}
}

// ErrUnknownEvent is returned for a payload that is neither a function URL request nor an API
// Gateway REST API proxy request: the function was wired to something else.
var ErrUnknownEvent = errors.New("lambdaserve: the event is neither a function URL request (payload 2.0) nor an API Gateway REST API proxy request (payload 1.0)")

// Invoke serves one invocation. It returns as soon as the handler has decided the status — the
// body keeps streaming from the returned reader, which the runtime copies to the Runtime API
// until the handler returns. The request's context is the invocation's, with its deadline.
func (s *Handler) Invoke(ctx context.Context, payload json.RawMessage) (io.Reader, error) {
	var probe struct {
		HTTPMethod     string `json:"httpMethod"`
		RequestContext struct {
			HTTP *struct{} `json:"http"`
		} `json:"requestContext"`
	}
	if err := json.Unmarshal(payload, &probe); err != nil {
		return nil, fmt.Errorf("lambdaserve: decode event: %w", err)
	}
	switch {
	case probe.RequestContext.HTTP != nil:
		var ev events.LambdaFunctionURLRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			return nil, fmt.Errorf("lambdaserve: decode function URL request: %w", err)
		}
		r, err := functionURLRequest(ctx, &ev)
		head, body, err := s.serve(r, err)
		if err != nil {
			return nil, err
		}
		resp := &events.LambdaFunctionURLStreamingResponse{StatusCode: head.status, Body: body}
		resp.Headers, _, resp.Cookies = preludeHeaders(head.header, true)
		return resp, nil
	case probe.HTTPMethod != "":
		var ev events.APIGatewayProxyRequest
		if err := json.Unmarshal(payload, &ev); err != nil {
			return nil, fmt.Errorf("lambdaserve: decode API Gateway request: %w", err)
		}
		r, err := restAPIRequest(ctx, &ev)
		head, body, err := s.serve(r, err)
		if err != nil {
			return nil, err
		}
		// Returned by pointer: a value would be marshalled to JSON instead of streamed, and the
		// status has no default here (a zero status is left out of the prelude).
		resp := &events.APIGatewayProxyStreamingResponse{StatusCode: head.status, Body: body}
		resp.Headers, resp.MultiValueHeaders, resp.Cookies = preludeHeaders(head.header, false)
		return resp, nil
	}
	return nil, ErrUnknownEvent
}

// serve runs the handler on r in its own goroutine and waits until it has decided the status.
// A request that could not be built (buildErr) is answered 400 without the handler.
func (s *Handler) serve(r *http.Request, buildErr error) (head, io.ReadCloser, error) {
	h := s.h
	if buildErr != nil {
		s.log.Warn("unusable request", slog.String("error", buildErr.Error()))
		h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "Bad Request", http.StatusBadRequest)
		})
		r, _ = http.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
	}
	pr, pw := io.Pipe()
	w := &responseWriter{header: http.Header{}, body: pw, ready: make(chan head, 1)}
	go func() {
		defer func() {
			v := recover()
			if v == nil {
				w.WriteHeader(http.StatusOK) // a handler that wrote nothing answers 200
				_ = pw.Close()
				return
			}
			err := fmt.Errorf("lambdaserve: handler panic: %v", v)
			if v != http.ErrAbortHandler {
				s.log.Error("handler panic", slog.String("error", err.Error()), slog.String("stack", string(debug.Stack())))
			}
			before := false // the panic came before the status: the invocation fails as a whole
			w.once.Do(func() {
				before = true
				w.ready <- head{err: err}
			})
			if !before {
				// The prelude is out; the runtime reports the error in the response's trailer.
				_ = pw.CloseWithError(err)
			}
		}()
		h.ServeHTTP(w, r)
	}()
	hd := <-w.ready
	return hd, pr, hd.err
}

// head is the status and headers a handler decided on, or the panic that ended it before.
type head struct {
	status int
	header http.Header
	err    error
}

// responseWriter writes the body into a pipe that the runtime reads into its streamed POST to
// the Runtime API. A Write returns once the runtime has taken the bytes, which makes Flush a
// no-op that succeeds.
type responseWriter struct {
	header http.Header
	body   *io.PipeWriter
	ready  chan head
	once   sync.Once // sends the status or a failure on ready, whichever comes first
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(status int) {
	if status < 200 {
		return // informational answers have no place in the prelude
	}
	w.once.Do(func() { w.ready <- head{status: status, header: w.header.Clone()} })
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if len(p) == 0 {
		return 0, nil
	}
	return w.body.Write(p)
}

// Flush has nothing to do: every Write has already been handed to the runtime. It makes the
// writer an http.Flusher, which http.ResponseController's Flush calls and reports as a success.
func (w *responseWriter) Flush() {}

// framingHeaders are decided by the function URL or API Gateway, not by the function: the
// response is streamed, so a Content-Length from the handler would describe a framing that is
// not used.
var framingHeaders = map[string]bool{"Content-Length": true, "Transfer-Encoding": true, "Connection": true}

// preludeHeaders splits a header into the prelude's one value per name, its multi-valued
// headers (the REST API's multiValueHeaders) and its cookies. With join, for a function URL,
// whose prelude has one value per name, several values are joined with ", " as HTTP allows.
func preludeHeaders(h http.Header, join bool) (map[string]string, map[string][]string, []string) {
	single := make(map[string]string, len(h))
	var multi map[string][]string
	var cookies []string
	for k, v := range h {
		switch {
		case framingHeaders[k]:
		case k == "Set-Cookie":
			cookies = v
		case len(v) == 1 || join:
			single[k] = strings.Join(v, ", ")
		default:
			if multi == nil {
				multi = map[string][]string{}
			}
			multi[k] = v
		}
	}
	return single, multi, cookies
}
