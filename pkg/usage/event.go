// Package usage defines the usage event every metered request leaves behind, named by its
// generation id; its DynamoDB item (EventItem, DecodeItem); and what is done with events after
// settlement: the aggregator function's decoding of the SQS messages that carry them (Handler,
// Decode) and their fold into the aggregates (Aggregator).
package usage

import (
	"encoding/json"
	"time"

	"github.com/neocloud/kiln/pkg/money"
)

// SchemaVersion is the version of the Event shape; it is bumped on any incompatible change.
const SchemaVersion = 1

// Status says how a request ended.
type Status string

const (
	// StatusCompleted: the backend answered and the whole answer reached the client.
	StatusCompleted Status = "completed"
	// StatusClientDisconnected: the client left before the answer ended; what was generated is billed.
	StatusClientDisconnected Status = "client_disconnected"
	// StatusUpstreamError: the backend failed, before or during the answer.
	StatusUpstreamError Status = "upstream_error"
	// StatusDeadlineExceeded: the function's deadline (less the settle reserve) ended the answer;
	// what was generated is billed (contract section 6).
	StatusDeadlineExceeded Status = "deadline_exceeded"
	// StatusRejected: the request was refused as its own fault: by the gateway's checks
	// (validation, unknown model), or by the backend, before or inside its stream. What a
	// backend generated before refusing (rarely anything) is billed.
	StatusRejected Status = "rejected"
	// StatusSlotLost: the request's in-flight lease could not be renewed, so it was stopped before
	// the lease expired; what was delivered is billed.
	StatusSlotLost Status = "slot_lost"
	// StatusInProgress is never recorded: GET /v1/generation shows it for a request still running.
	StatusInProgress Status = "in_progress"
)

// Event is the usage record of one request that reached endpoint checks (contract section 8).
// Field names are the wire names of the event's JSON and of exports.
type Event struct {
	Version          int          `json:"version"`
	GenerationID     string       `json:"generation_id"`
	OrgID            string       `json:"org_id"`
	KeyID            string       `json:"key_id"` // the key's display prefix, never the key
	Model            string       `json:"model"`  // the public model id, "" when the request named none
	Endpoint         string       `json:"endpoint"`
	Stream           bool         `json:"stream"`
	Status           Status       `json:"status"`
	HTTPStatus       int          `json:"http_status"`
	FinishReason     string       `json:"finish_reason"` // null on the wire when "" (see MarshalJSON)
	PromptTokens     int64        `json:"prompt_tokens"`
	CachedTokens     int64        `json:"cached_tokens"`
	CompletionTokens int64        `json:"completion_tokens"`
	Cost             money.Amount `json:"cost"` // a decimal string on the wire
	Estimated        bool         `json:"estimated"`
	StartedAt        time.Time    `json:"started_at"`
	TTFTMillis       int64        `json:"ttft_ms"`
	DurationMillis   int64        `json:"duration_ms"`
	Backend          string       `json:"backend"`
}

// MaxModelLen bounds Model, in bytes: a catalog id has at most 256 (catalog.MaxIDLen), and the
// gateway records a longer id that a client sent by its first 64 bytes and "…".
const MaxModelLen = 256

// MaxFinishReasonLen bounds FinishReason, in bytes; the gateway cuts a longer one a backend sent.
const MaxFinishReasonLen = 64

// MarshalJSON writes the event as events/usage-event.schema.json describes it: every field, with
// finish_reason null when the backend gave none. Stores may keep "" for none; every output shows
// null. Decoding needs no counterpart: encoding/json reads null into a string as "".
func (e Event) MarshalJSON() ([]byte, error) {
	type fields Event // the same fields without this method
	var reason *string
	if e.FinishReason != "" {
		reason = &e.FinishReason
	}
	return json.Marshal(struct {
		fields
		FinishReason *string `json:"finish_reason"`
	}{fields(e), reason})
}

// Day is the UTC calendar day ("2026-11-29") an event is aggregated under.
func (e Event) Day() string { return e.StartedAt.UTC().Format(time.DateOnly) }
