package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/openai"
	"github.com/neocloud/kiln/pkg/store"
)

// apiError is an error a client may see: a status and the OpenAI error body. Handlers return
// errors, and answer, below, is the one place that decides what a client sees of one.
type apiError struct {
	status int // 0 for an error event inside a stream, which has its status already
	body   openai.Error
	// retryAfter, when set, is sent as an HTTP-date Retry-After header (maintenance only).
	retryAfter time.Time
	// close asks for the connection to be closed after the answer (Connection: close).
	close bool
	// plain sends "Bad Gateway: " and the message as text: the 502 the seed pages document.
	plain bool
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.status, e.body.Code, e.body.Message)
}

// admissionError is the store's refusal of an admission, with what the client's message quotes.
type admissionError struct {
	err     error
	reserve money.Amount // the request's worst case
	limit   int          // the organization's in-flight limit
}

func (e *admissionError) Error() string { return "admission: " + e.err.Error() }
func (e *admissionError) Unwrap() error { return e.err }

// answer is what a client sees of err: an *apiError as it is; the store's refusals of a key, an
// organization or an admission as the contract names them; anything else as the generic 503,
// whose cause the caller has logged. A client never sees an error's own text.
func answer(err error) *apiError {
	var e *apiError
	var adm *admissionError
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, store.ErrSuspended):
		return errSuspended
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrKeyRevoked):
		return errBadKey // also an organization deleted under a cached key
	case errors.As(err, &adm) && errors.Is(err, store.ErrInsufficientCredits):
		return errNoCredits(adm.reserve)
	case errors.As(err, &adm) && errors.Is(err, store.ErrSlotsFull):
		return errRateLimited(adm.limit)
	}
	return errStoreDown
}

// known reports whether answer has a message of its own for err; the others are logged.
func known(err error) bool { return answer(err) != errStoreDown || errors.Is(err, errStoreDown) }

// writeError answers with err, as answer decides. The caller has already set
// X-Neocloud-Generation-Id where it applies.
func writeError(w http.ResponseWriter, err error) {
	e := answer(err)
	h := w.Header()
	if !e.retryAfter.IsZero() {
		h.Set("Retry-After", e.retryAfter.UTC().Format(http.TimeFormat))
	}
	if e.close {
		h.Set("Connection", "close")
	}
	if e.plain {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(e.status)
		fmt.Fprintf(w, "Bad Gateway: %s\n", e.body.Message)
		return
	}
	openai.WriteError(w, e.status, e.body)
}

// errorEventData is err as a stream's last event, as answer decides.
func errorEventData(err error) []byte {
	return openai.AppendData(nil, answer(err).body.AppendJSON(nil))
}

// newError is the error of status with an OpenAI error body of no param.
func newError(status int, typ, code, message string) *apiError {
	return &apiError{status: status, body: openai.Error{Message: message, Type: typ, Code: code}}
}

// typeServer is OpenAI's type of an error of the server's own; the gateway sends it only in
// the last event of a stream that had already answered 200.
const typeServer = "server_error"

func invalid(param, code, format string, args ...any) *apiError {
	e := newError(http.StatusBadRequest, openai.TypeInvalidRequest, code, fmt.Sprintf(format, args...))
	e.body.Param = param
	return e
}

func errMaintenance(until time.Time) *apiError {
	e := newError(http.StatusServiceUnavailable, openai.TypeServiceUnavailable, "maintenance", "The service is in maintenance until "+until.UTC().Format(time.RFC3339)+". Retry after that time.")
	e.retryAfter = until
	return e
}

// errRequestTimeout is the 408 of a body that stalled; the connection is closed after it, as the
// rest of the body may still be on its way.
func errRequestTimeout(every time.Duration) *apiError {
	e := newError(http.StatusRequestTimeout, openai.TypeInvalidRequest, "request_timeout", "The request body did not arrive in time: nothing of it came for "+every.String()+". Send the whole body without pausing.")
	e.close = true
	return e
}

func errTooLarge(limit int64) *apiError {
	return newError(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "request_too_large", fmt.Sprintf("The request body is larger than the limit of %d bytes.", limit))
}

var (
	errNoKey         = newError(http.StatusUnauthorized, openai.TypeAuthentication, "invalid_api_key", "You didn't provide an API key. Send it in the Authorization header as 'Authorization: Bearer YOUR_KEY'.")
	errBadKey        = newError(http.StatusUnauthorized, openai.TypeAuthentication, "invalid_api_key", "Incorrect API key provided, or the key was revoked.")
	errSuspended     = newError(http.StatusForbidden, openai.TypePermission, "organization_suspended", "Your organization is suspended. Contact support to resume it.")
	errStoreDown     = newError(http.StatusServiceUnavailable, openai.TypeServiceUnavailable, "store_unavailable", "The service is temporarily unable to process your request. Retry with exponential backoff.")
	errSlotLost      = newError(http.StatusServiceUnavailable, openai.TypeServiceUnavailable, "slot_lost", "The request was stopped because the gateway could not keep its in-flight slot. Retry with exponential backoff.")
	errEmptyMessages = invalid("messages", "empty_array", "Invalid 'messages': the array must contain at least one message.")
)

// The plain-text 502s of a backend that failed.
var (
	errBackendUnreachable = errBadGateway("the model backend was unreachable or did not answer in time.")
	errBackendFailed      = errBadGateway("the model backend failed.")
	errBackendStatus      = errBadGateway("the model backend returned an error.")
)

func errBadGateway(reason string) *apiError {
	return &apiError{status: http.StatusBadGateway, plain: true, body: openai.Error{Message: reason}}
}

// The last events of streams the gateway ends with an error; what was generated is billed.
var (
	errStreamBroke    = newError(0, typeServer, "upstream_stream_error", "The model backend failed while streaming the response. The part generated so far is billed.")
	errStreamSlotLost = newError(0, typeServer, "slot_lost", "The gateway could not keep this request's in-flight slot and stopped it. The part generated so far is billed.")
	errStreamDeadline = newError(0, typeServer, "deadline_exceeded", "The response reached the gateway's time limit and was cut. The part generated so far is billed.")
	// errStreamUnrecorded ends a complete answer whose settlement did not commit in time.
	errStreamUnrecorded = newError(0, typeServer, "store_unavailable", "The answer could not be recorded in time, so it ends without [DONE]. The part delivered is billed once it is recorded.")
)

// errNoCredits is the 402 of an admission whose worst case does not fit what is available.
func errNoCredits(reserve money.Amount) *apiError {
	msg := "Your organization has no credits left. Add credits to continue."
	if reserve > 0 {
		msg = fmt.Sprintf("Your organization's available credits (its balance less what its requests in flight have reserved) do not cover this request's maximum cost of $%s. Add credits, or set a lower max_tokens.", reserve)
	}
	return newError(http.StatusPaymentRequired, openai.TypeBilling, "insufficient_credits", msg)
}

func errRateLimited(limit int) *apiError {
	return newError(http.StatusTooManyRequests, openai.TypeRateLimit, "rate_limit_exceeded", fmt.Sprintf("Your organization already has %d requests in flight, its limit. Retry with exponential backoff.", limit))
}

// errModelNotFound quotes at most quoteLen bytes of the id: a client's id may be of any length up
// to the body limit, and a catalog id is at most catalog.MaxIDLen.
func errModelNotFound(id string) *apiError {
	e := newError(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "The model `"+clip(id, quoteLen)+"` does not exist or you do not have access to it.")
	e.body.Param = "model"
	return e
}

func errNotFound(msg, code string) *apiError {
	return newError(http.StatusNotFound, openai.TypeInvalidRequest, code, msg)
}

func errMethod(r *http.Request, allowed string) *apiError {
	return newError(http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "method_not_allowed", fmt.Sprintf("Method %s is not allowed on %s; use %s.", clip(r.Method, quoteLen), clip(r.URL.Path, quoteLen), allowed))
}

func errUnavailable(model string) *apiError {
	return newError(http.StatusServiceUnavailable, openai.TypeServiceUnavailable, "backend_unavailable", "No backend of model "+model+" is available right now. Retry with exponential backoff.")
}

// errDeadline is a request whose time limit (on Lambda, the invocation's deadline less the settle
// reserve) ended before the model backend answered; tooShort says it ended before the backend was
// even called. It is the gateway's limit, not the backend's failure: 503, not a 502.
func errDeadline(tooShort bool) *apiError {
	msg := "The model backend did not answer within the gateway's time limit. Retry, or ask for less (max_tokens)."
	if tooShort {
		msg = "The request's time limit leaves no time to call the model backend and settle the request: the function's timeout is shorter than its settle reserve (KILN_SETTLE_RESERVE)."
	}
	return newError(http.StatusServiceUnavailable, openai.TypeServiceUnavailable, "deadline_exceeded", msg)
}

// errRefused is the client's error for a request the backend refused (a 501, "not implemented",
// included): a 400 with the backend's message, cleaned (msg), its param and no code.
func errRefused(msg, param string) *apiError {
	return &apiError{status: http.StatusBadRequest, body: openai.Error{Message: msg, Type: openai.TypeInvalidRequest, Param: clip(param, quoteLen)}}
}

// quoteLen is how much of a client's string, in bytes, an error message quotes (contract section
// 4): enough to recognise it, never enough to make an answer or a log line large.
const quoteLen = 64

// clip returns s cut to at most max bytes, at a character boundary, with "…" when it was cut.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// backendError is what a model server said when it refused a request: in an error body, or in
// an error event inside a stream it had answered with 200.
type backendError struct {
	status  int    // the HTTP status the server named in "code" (or answered with); 0 when unknown
	message string // as the server wrote it, "" when it wrote none
	param   string
}

// rejects reports whether a status says the request was at fault, so that the client gets the
// server's message as a 400: the contract's 400, 413 and 422, and 501, vLLM's answer to a
// feature the request asks for and the server does not implement.
func rejects(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity, http.StatusNotImplemented:
		return true
	}
	return false
}

// engineFailure reports whether a backend's message, whatever its status, says the server's
// engine failed rather than that the request was wrong: some vLLM versions answer an engine
// RuntimeError, or a dead engine (EngineDeadError, "EngineCore encountered an issue"), with 400.
// Such an answer is the backend's failure: a 502 for the client, counted by the breaker.
func engineFailure(msg string) bool {
	return containsAny(msg, "EngineCore encountered an issue", "EngineDeadError", "EngineGenerateError", "CUDA error", "RuntimeError")
}

// containsAny reports whether s contains any of subs.
func containsAny(s string, subs ...string) bool {
	return slices.ContainsFunc(subs, func(sub string) bool { return strings.Contains(s, sub) })
}

// parseBackendError reads a model server's error: vLLM's {"error":{"message","type","param",
// "code":400}}, SGLang's flat {"object":"error","message","type","param","code":400} (inside
// {"error": ...} in its streams), OpenAI's {"error":{...,"code":"a_string"}} and FastAPI's
// {"detail": ...}. A body cut short (over the read limit) still yields its message, as far as
// it goes. It is a server's text, read as any other (openai.DecodeLast): of a name written twice,
// the last counts. ok is false when raw holds none of these.
func parseBackendError(raw []byte) (be backendError, ok bool) {
	var resp openai.ErrorResponse
	if err := openai.DecodeLast(raw, &resp); err != nil {
		m := messagePrefix(raw)
		return backendError{message: m}, m != ""
	}
	body := resp.ErrorBody
	if resp.Error.Kind() == '{' {
		if body = (openai.ErrorBody{}); openai.DecodeLast(resp.Error, &body) != nil {
			return backendError{}, false // not reached: the whole text was read
		}
	}
	be.message, _ = openai.String(body.Message)
	be.param, _ = openai.String(body.Param)
	if n, err := strconv.Atoi(string(body.Code)); err == nil && n >= 100 && n <= 599 {
		be.status = n
	}
	if body.Detail != nil && be.message == "" {
		be.message = detailMessage(body.Detail)
	}
	return be, be.message != "" || be.status != 0
}

// detailMessage renders FastAPI's detail: a string as it is, pydantic's list of errors as
// "loc: msg" pairs (without the "body" the location starts with, and without the input each
// error repeats).
func detailMessage(v jsontext.Value) string {
	if s, ok := openai.String(v); ok {
		return s
	}
	var errs []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if openai.DecodeLast(v, &errs) != nil {
		return ""
	}
	parts := make([]string, 0, len(errs))
	for _, e := range errs {
		parts = append(parts, location(e.Loc)+e.Msg)
	}
	return strings.Join(parts, "; ")
}

// location renders a pydantic error location, ("body", "messages", 0, "role"), as
// "messages[0].role: ".
func location(loc []any) string {
	var b strings.Builder
	for i, l := range loc {
		switch v := l.(type) {
		case string:
			if i == 0 && v == "body" {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(v)
		case float64:
			fmt.Fprintf(&b, "[%d]", int(v))
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return b.String() + ": "
}

// messagePrefix finds the "message" string of a JSON error cut short and decodes as much of it
// as there is; "" when there is none.
func messagePrefix(raw []byte) string {
	_, rest, found := bytes.Cut(raw, []byte(`"message"`))
	rest, colon := bytes.CutPrefix(bytes.TrimLeft(rest, " \t\r\n"), []byte(":"))
	rest = bytes.TrimLeft(rest, " \t\r\n")
	if !found || !colon || len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	if v, err := jsontext.NewDecoder(bytes.NewReader(rest), jsontext.AllowInvalidUTF8(true)).ReadValue(); err == nil {
		m, _ := openai.String(v) // the whole string arrived
		return m
	}
	// The string closed where it was cut, less an escape (or a character) that did not arrive
	// whole: at most six bytes, as in \u00e9.
	for cut := len(rest); cut > max(1, len(rest)-6); cut-- {
		if m, ok := openai.String(append(rest[:cut:cut], '"')); ok {
			return m
		}
	}
	return ""
}

// maxBackendMessage bounds the part of a backend's message a client sees.
const maxBackendMessage = 500

// backendMessage turns a model server's message into what a client may see, and what the log
// keeps. The log text is the server's message without the request's content, which pydantic
// repeats in its validation errors (its 'input' and input_value, the whole forwarded body for
// some checks) and which must never reach a log. The client's text also loses vLLM's
// "(parameter=…, value=…)" suffix (the param travels on its own), names the public model
// instead of the backend's, and is at most 500 bytes; a message about what the gateway added
// to the request (stream_options it injected) or that is raw JSON is replaced by a plain one.
func backendMessage(raw, backendModel, publicModel string, injected []string) (client, logged string) {
	logged = dropInputEchoes(raw)
	msg := strings.TrimSpace(pydanticErrors(logged))
	if i := strings.LastIndex(msg, " (parameter="); i > 0 && strings.HasSuffix(msg, ")") {
		msg = strings.TrimSpace(msg[:i])
	}
	if backendModel != "" && backendModel != publicModel {
		msg = strings.ReplaceAll(msg, backendModel, publicModel)
	}
	if msg == "" || containsAny(msg, injected...) || msg[0] == '{' || msg[0] == '[' || msg[0] == '<' {
		return "The model server rejected the request.", logged
	}
	return clip(msg, maxBackendMessage), logged
}

// pydanticErrors renders a message that is pydantic's list of errors, as FastAPI's str() of a
// validation error writes it ("[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field
// required', ...}]"), as "messages: Field required"; any other message is returned as it is.
func pydanticErrors(msg string) string {
	matches := pydanticError.FindAllStringSubmatch(msg, -1)
	if len(matches) == 0 {
		return msg
	}
	parts := make([]string, 0, len(matches))
	for _, m := range matches {
		var loc []any
		for _, l := range strings.Split(m[1], ",") {
			l = strings.Trim(strings.TrimSpace(l), "'\"")
			if n, err := strconv.Atoi(l); err == nil {
				loc = append(loc, float64(n))
			} else if l != "" {
				loc = append(loc, l)
			}
		}
		parts = append(parts, location(loc)+m[2])
	}
	return strings.Join(parts, "; ")
}

var pydanticError = regexp.MustCompile(`'loc': \(([^)]*)\), 'msg': ['"]((?:[^'"\\]|\\.)*)['"]`)

// dropInputEchoes replaces each value pydantic repeats from the request (after 'input': in its
// error list, "input": in the list written as JSON, input_value= in its error text) with "…".
func dropInputEchoes(msg string) string {
	for _, marker := range [...]string{"'input':", `"input":`, "input_value="} {
		var b strings.Builder
		for rest := msg; ; {
			before, after, found := strings.Cut(rest, marker)
			b.WriteString(before)
			if !found {
				break
			}
			value := strings.TrimLeft(after, " ")
			b.WriteString(marker + after[:len(after)-len(value)] + "…")
			rest = value[pythonValueLen(value):]
		}
		msg = b.String()
	}
	return msg
}

// pythonValueLen is the length of the Python literal (as repr writes dicts, lists, tuples,
// strings, numbers, True/None) at the start of s; a literal that does not end runs to the end.
func pythonValueLen(s string) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
				if depth == 0 {
					return i + 1
				}
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '{' || c == '[' || c == '(':
			depth++
		case c == '}' || c == ']' || c == ')':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case (c == ',' || c == ' ') && depth == 0:
			return i
		}
	}
	return len(s)
}
