// Package openai is the wire format of OpenAI-compatible APIs as the gateway needs it: the error
// envelope, byte-preserving inspection and rewriting of JSON objects, usage objects, and
// server-sent events. It imports nothing of Kiln's.
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

// Field is one member of a JSON object, located in the object's bytes. ParseObject finds them.
type Field struct {
	KeyStart, KeyEnd     int // raw[KeyStart:KeyEnd] is the key as written, quotes included
	ValueStart, ValueEnd int // raw[ValueStart:ValueEnd] is the value exactly as written
}

// Usage is a usage object's token counts.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	CachedTokens     int64 // prompt_tokens_details.cached_tokens; 0 when absent
}

// Event is one server-sent event. Data is valid until the next call to Decoder.Next.
type Event struct {
	Name    string // the "event:" field; "" for the default
	Data    []byte // the "data:" lines joined by '\n'; nil when the event had none
	Comment bool   // the block held only comment lines (": keepalive") and no fields
}
