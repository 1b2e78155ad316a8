package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/neocloud/kiln/pkg/openai"
)

// apiError is an error a client may see: a status and the OpenAI error body. Everything else
// that goes wrong is logged and shown as a generic error; this is the one place that decides.
type apiError struct {
	status int
	body   openai.Error
	// retryAfter, when set, is sent as an HTTP-date Retry-After header (maintenance only).
	retryAfter time.Time
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.status, e.body.Code, e.body.Message)
}

func invalid(param, code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, body: openai.Error{
		Message: fmt.Sprintf(format, args...), Type: openai.TypeInvalidRequest, Param: param, Code: code,
	}}
}

func errMaintenance(until time.Time) *apiError {
	return &apiError{
		status: http.StatusServiceUnavailable,
		body: openai.Error{
			Message: "The service is in maintenance until " + until.UTC().Format(time.RFC3339) + ". Retry after that time.",
			Type:    openai.TypeServiceUnavailable,
			Code:    "maintenance",
		},
		retryAfter: until,
	}
}

func errTooLarge(limit int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, body: openai.Error{
		Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", limit),
		Type:    openai.TypeInvalidRequest,
		Code:    "request_too_large",
	}}
}

var (
	errNoKey = &apiError{status: http.StatusUnauthorized, body: openai.Error{
		Message: "You didn't provide an API key. Send it in the Authorization header as 'Authorization: Bearer YOUR_KEY'.",
		Type:    openai.TypeAuthentication,
		Code:    "invalid_api_key",
	}}
	errBadKey = &apiError{status: http.StatusUnauthorized, body: openai.Error{
		Message: "Incorrect API key provided, or the key was revoked.",
		Type:    openai.TypeAuthentication,
		Code:    "invalid_api_key",
	}}
	errSuspended = &apiError{status: http.StatusForbidden, body: openai.Error{
		Message: "Your organization is suspended. Contact support to resume it.",
		Type:    openai.TypePermission,
		Code:    "organization_suspended",
	}}
	errNoCredits = &apiError{status: http.StatusPaymentRequired, body: openai.Error{
		Message: "Your organization has no credits left. Add credits to continue.",
		Type:    openai.TypeBilling,
		Code:    "insufficient_credits",
	}}
	errStoreDown = &apiError{status: http.StatusServiceUnavailable, body: openai.Error{
		Message: "The service is temporarily unable to process your request. Retry with exponential backoff.",
		Type:    openai.TypeServiceUnavailable,
	}}
	errEmptyMessages = invalid("messages", "empty_array", "Invalid 'messages': the array must contain at least one message.")
)

func errRateLimited(limit int) *apiError {
	return &apiError{status: http.StatusTooManyRequests, body: openai.Error{
		Message: fmt.Sprintf("Your organization already has %d requests in flight, its limit. Retry with exponential backoff.", limit),
		Type:    openai.TypeRateLimit,
		Code:    "rate_limit_exceeded",
	}}
}

func errModelNotFound(id string) *apiError {
	return &apiError{status: http.StatusNotFound, body: openai.Error{
		Message: "The model `" + id + "` does not exist or you do not have access to it.",
		Type:    openai.TypeInvalidRequest,
		Param:   "model",
		Code:    "model_not_found",
	}}
}

func errNotFound(msg, code string) *apiError {
	return &apiError{status: http.StatusNotFound, body: openai.Error{Message: msg, Type: openai.TypeInvalidRequest, Code: code}}
}

func errMethod(r *http.Request, allowed string) *apiError {
	return &apiError{status: http.StatusMethodNotAllowed, body: openai.Error{
		Message: fmt.Sprintf("Method %s is not allowed on %s; use %s.", r.Method, r.URL.Path, allowed),
		Type:    openai.TypeInvalidRequest,
		Code:    "method_not_allowed",
	}}
}

func errUnavailable(model string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, body: openai.Error{
		Message: "No backend of model " + model + " is available right now. Retry with exponential backoff.",
		Type:    openai.TypeServiceUnavailable,
		Code:    "backend_unavailable",
	}}
}

// errDeadline is a request whose time limit (on Lambda, the invocation's deadline less the settle
// reserve) ended before the model backend answered; tooShort says it ended before the backend was
// even called. It is the gateway's limit, not the backend's failure: 503, not a 502.
func errDeadline(tooShort bool) *apiError {
	msg := "The model backend did not answer within the gateway's time limit. Retry, or ask for less (max_tokens)."
	if tooShort {
		msg = "The request's time limit leaves no time to call the model backend and settle the request: the function's timeout is shorter than its settle reserve (KILN_SETTLE_RESERVE)."
	}
	return &apiError{status: http.StatusServiceUnavailable, body: openai.Error{
		Message: msg,
		Type:    openai.TypeServiceUnavailable,
		Code:    "deadline_exceeded",
	}}
}

// upstreamInvalid is a model server's own 400: its message, in our shape, with no code.
func upstreamInvalid(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, body: openai.Error{Message: msg, Type: openai.TypeInvalidRequest}}
}

// writeError writes e. The caller has already set X-Neocloud-Generation-Id where it applies.
func writeError(w http.ResponseWriter, e *apiError) {
	if !e.retryAfter.IsZero() {
		w.Header().Set("Retry-After", e.retryAfter.UTC().Format(http.TimeFormat))
	}
	openai.WriteError(w, e.status, e.body)
}

// badGateway is the plain-text 502 the seed pages document.
func badGateway(w http.ResponseWriter, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, "Bad Gateway: %s\n", reason)
}
