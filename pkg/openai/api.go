// Package openai is the wire format of OpenAI-compatible APIs as the gateway needs it: typed
// requests, answers, chunks, usage and errors, byte-preserving edits of JSON objects (a small
// facade over go-json-experiment/json), the error envelope, and server-sent events. It imports
// nothing of Kiln's.
package openai

// Error is the body of every gateway error: {"error":{"message","type","param","code"}}.
// Param and Code are JSON null when empty.
type Error struct {
	Message string
	Type    string
	Param   string
	Code    string
}

// Error types, by HTTP status.
const (
	TypeInvalidRequest     = "invalid_request_error" // 400, 404, 413
	TypeAuthentication     = "authentication_error"  // 401
	TypeBilling            = "billing_error"         // 402
	TypePermission         = "permission_error"      // 403
	TypeRateLimit          = "rate_limit_error"      // 429
	TypeServiceUnavailable = "service_unavailable"   // 503
)

// Event is one server-sent event. Data is valid until the next call to Decoder.Next.
type Event struct {
	Name    string // the "event:" field; "" for the default
	Data    []byte // the "data:" lines joined by '\n'; nil when the event had none
	Comment bool   // the block held only comment lines (": keepalive") and no fields
}
