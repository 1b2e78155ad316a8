// The aggregator function's side of the usage pipeline. Handler takes usage events off the SQS queue that the EventBridge Pipe fills from the
// usage table's DynamoDB stream: each message body is one stream record whose NewImage is the
// usage item (events/sqs-pipe-usage-batch.json). Messages an EventBridge rule delivered before
// the pipe existed (an envelope with source kiln.gateway, detail-type usage.recorded and the
// Event as its detail) are still read, so that an upgrade loses none in flight. Messages
// that decode and validate go to a Recorder; the ids of the others, and of those the Recorder
// refused, go back as batch item failures, so that SQS redelivers only them and, after the
// queue's maxReceiveCount, moves them to the dead-letter queue (the event source mapping must have
// ReportBatchItemFailures on). Records that hold no final usage record (ErrNotFinal) are
// acknowledged.

package usage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/neocloud/kiln/pkg/ddbitem"
)

// The envelope fields of the usage events the gateway published with PutEvents before the usage
// table's stream replaced them (contract section 8).
const (
	EnvelopeSource     = "kiln.gateway"
	EnvelopeDetailType = "usage.recorded"
)

// Recorder takes the valid usage events of a batch together: Aggregator, the fold into per
// organization × day × model and per month roll-ups, idempotent by generation id, which on the
// DynamoDB store folds a batch in one transaction of up to a hundred items where one event alone
// takes a transaction of three. RecordBatch returns each event's error, in order; an error makes
// the event's message a batch item failure, to be delivered again.
type Recorder interface {
	RecordBatch(ctx context.Context, es []Event) []error
}

// Handler processes SQS batches of usage events.
type Handler struct {
	rec Recorder
	log *slog.Logger
}

// NewHandler returns a Handler that hands valid events to rec. A nil log discards.
func NewHandler(rec Recorder, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{rec: rec, log: log}
}

// Handle processes one batch and reports only the messages that failed. It never fails the
// batch as a whole: a whole-batch error would redeliver the messages that succeeded too.
func (h *Handler) Handle(ctx context.Context, batch events.SQSEvent) (events.SQSEventResponse, error) {
	resp := events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}
	errs := make([]error, len(batch.Records))
	var es []Event
	var at []int // the message of each event
	for i, m := range batch.Records {
		if err := ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("not processed before the invocation ended: %w", err)
			continue
		}
		e, err := Decode([]byte(m.Body))
		switch {
		case errors.Is(err, ErrNotFinal): // acknowledged: nothing to fold
			h.log.LogAttrs(ctx, slog.LevelWarn, "usage message skipped: the pipe's filter should have kept it off the queue",
				slog.String("message_id", m.MessageId), slog.String("reason", err.Error()))
		case err != nil:
			errs[i] = err
		default:
			es = append(es, e)
			at = append(at, i)
		}
	}
	for k, err := range h.rec.RecordBatch(ctx, es) {
		if err != nil {
			errs[at[k]] = fmt.Errorf("record %s: %w", es[k].GenerationID, err)
		}
	}
	for i, m := range batch.Records {
		if err := errs[i]; err != nil {
			h.log.LogAttrs(ctx, slog.LevelWarn, "usage message failed",
				slog.String("message_id", m.MessageId),
				slog.String("receive_count", m.Attributes["ApproximateReceiveCount"]),
				slog.String("error", err.Error()))
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
		}
	}
	return resp, nil
}

// Decode reads one message body, validated: a DynamoDB stream record of the usage table, as the
// pipe delivers it, or an EventBridge envelope with the usage event in its detail. A record that
// holds no final usage record is ErrNotFinal. In an envelope every field of the event is required
// and no other is allowed (the schema is events/usage-event.schema.json).
func Decode(body []byte) (Event, error) {
	var env message
	if err := json.Unmarshal(body, &env); err != nil {
		return Event{}, fmt.Errorf("neither a DynamoDB stream record nor an EventBridge envelope: %w", err)
	}
	if env.EventSource == StreamEventSource {
		return decodeStreamRecord(env)
	}
	if env.Source != EnvelopeSource || env.DetailType != EnvelopeDetailType {
		return Event{}, fmt.Errorf("envelope source %q, detail-type %q: want %q, %q", env.Source, env.DetailType, EnvelopeSource, EnvelopeDetailType)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(env.Detail, &fields); err != nil || fields == nil {
		return Event{}, errors.New("detail is not a JSON object")
	}
	var missing []string
	for _, name := range eventFields {
		if _, ok := fields[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return Event{}, fmt.Errorf("usage event without %s", strings.Join(missing, ", "))
	}
	if c := fields["cost"]; len(c) == 0 || c[0] != '"' {
		return Event{}, errors.New("cost: want a decimal string")
	}
	dec := json.NewDecoder(bytes.NewReader(env.Detail))
	dec.DisallowUnknownFields()
	var e Event
	if err := dec.Decode(&e); err != nil {
		return Event{}, fmt.Errorf("usage event: %w", err)
	}
	if err := Validate(e); err != nil {
		return Event{}, err
	}
	return e, nil
}

// message is one message body: a DynamoDB stream record (eventSource aws:dynamodb, its
// NewImage the usage item in DynamoDB JSON) or an EventBridge envelope (the event its detail).
type message struct {
	EventSource string `json:"eventSource"`
	EventName   string `json:"eventName"`
	Change      struct {
		NewImage ddbitem.JSONItem `json:"NewImage"`
	} `json:"dynamodb"`
	Source     string          `json:"source"`
	DetailType string          `json:"detail-type"`
	Detail     json.RawMessage `json:"detail"`
}

var generationID = regexp.MustCompile(`^gen-[0-9A-Za-z]{1,64}$`)

// Validate checks what a usage event's fields may hold, reporting every problem together.
func Validate(e Event) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if e.Version != SchemaVersion {
		bad("version %d: want %d", e.Version, SchemaVersion)
	}
	if !generationID.MatchString(e.GenerationID) {
		bad("generation_id %q: want gen- and up to 64 letters or digits", e.GenerationID)
	}
	if e.OrgID == "" {
		bad("org_id is empty")
	}
	if e.KeyID == "" {
		bad("key_id is empty")
	}
	switch e.Endpoint {
	case "/v1/chat/completions", "/v1/completions":
	default:
		bad("endpoint %q: want /v1/chat/completions or /v1/completions", e.Endpoint)
	}
	switch e.Status {
	case StatusCompleted, StatusClientDisconnected, StatusUpstreamError, StatusDeadlineExceeded,
		StatusSlotLost, StatusRejected:
	default:
		bad("status %q: want completed, client_disconnected, upstream_error, deadline_exceeded, slot_lost or rejected", e.Status)
	}
	if e.HTTPStatus < 100 || e.HTTPStatus > 599 {
		bad("http_status %d: want 100–599", e.HTTPStatus)
	}
	if e.PromptTokens < 0 || e.CachedTokens < 0 || e.CompletionTokens < 0 {
		bad("negative token count")
	}
	if e.CachedTokens > e.PromptTokens {
		bad("cached_tokens %d above prompt_tokens %d", e.CachedTokens, e.PromptTokens)
	}
	if e.Cost < 0 {
		bad("cost %s is negative", e.Cost)
	}
	if e.StartedAt.IsZero() || e.StartedAt.Equal(time.Unix(0, 0)) { // a usage item's zero is the Unix epoch
		bad("started_at is zero")
	}
	if e.TTFTMillis < 0 || e.DurationMillis < 0 {
		bad("negative ttft_ms or duration_ms")
	}
	// The gateway bounds what clients and backends put in these; a longer one did not come from it.
	if len(e.Model) > MaxModelLen {
		bad("model of %d bytes: at most %d", len(e.Model), MaxModelLen)
	}
	if len(e.FinishReason) > MaxFinishReasonLen {
		bad("finish_reason of %d bytes: at most %d", len(e.FinishReason), MaxFinishReasonLen)
	}
	if len(e.Backend) > MaxModelLen {
		bad("backend of %d bytes: at most %d", len(e.Backend), MaxModelLen)
	}
	return errors.Join(errs...)
}

// eventFields are the JSON names of Event, all required.
var eventFields = func() []string {
	t := reflect.TypeFor[Event]()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}()

// EventFields returns the JSON names of a usage event's fields, in declaration order.
func EventFields() []string { return append([]string(nil), eventFields...) }
