package usage

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/neocloud/kiln/pkg/money"
)

func validEvent() Event {
	return Event{
		Version: SchemaVersion, GenerationID: "gen-01JDZ8K3W6Q2V7N4R5T8Y9B0CD", OrgID: "org_a", KeyID: "kiln-AbC123xY",
		Model: "gpt-oss-120b", Endpoint: "/v1/chat/completions", Stream: true, Status: StatusCompleted,
		HTTPStatus: 200, FinishReason: "stop", PromptTokens: 9, CompletionTokens: 12, Cost: 1155 * money.Picodollar * 1000,
		StartedAt: time.Date(2026, 11, 29, 17, 20, 0, 0, time.UTC), TTFTMillis: 80, DurationMillis: 400, Backend: "b",
	}
}

func envelope(t *testing.T, detail any, source, detailType string) string {
	t.Helper()
	d, err := json.Marshal(detail)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"version": "0", "id": "x", "source": source, "detail-type": detailType, "detail": json.RawMessage(d)})
	return string(b)
}

func TestDecode(t *testing.T) {
	asMap := func(mod func(map[string]any)) map[string]any {
		b, _ := json.Marshal(validEvent())
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		mod(m)
		return m
	}
	for _, tc := range []struct {
		name   string
		body   string
		errHas string // "" for valid
	}{
		{"valid", envelope(t, validEvent(), EnvelopeSource, EnvelopeDetailType), ""},
		{"not JSON", "{", "neither a DynamoDB stream record nor an EventBridge envelope"},
		{"wrong source", envelope(t, validEvent(), "other", EnvelopeDetailType), "source"},
		{"wrong detail-type", envelope(t, validEvent(), EnvelopeSource, "other"), "detail-type"},
		{"detail not an object", envelope(t, []int{1}, EnvelopeSource, EnvelopeDetailType), "not a JSON object"},
		{"missing field", envelope(t, asMap(func(m map[string]any) { delete(m, "org_id"); delete(m, "cost") }), EnvelopeSource, EnvelopeDetailType), "without org_id, cost"},
		{"unknown field", envelope(t, asMap(func(m map[string]any) { m["extra"] = 1 }), EnvelopeSource, EnvelopeDetailType), "unknown field"},
		{"cost as a number", envelope(t, asMap(func(m map[string]any) { m["cost"] = 0.5 }), EnvelopeSource, EnvelopeDetailType), "decimal string"},
		{"bad cost", envelope(t, asMap(func(m map[string]any) { m["cost"] = "1e-6" }), EnvelopeSource, EnvelopeDetailType), "usage event"},
		{"negative cost", envelope(t, asMap(func(m map[string]any) { m["cost"] = "-1" }), EnvelopeSource, EnvelopeDetailType), "negative"},
		{"bad version", envelope(t, asMap(func(m map[string]any) { m["version"] = 2 }), EnvelopeSource, EnvelopeDetailType), "version"},
		{"bad id", envelope(t, asMap(func(m map[string]any) { m["generation_id"] = "x" }), EnvelopeSource, EnvelopeDetailType), "generation_id"},
		{"bad status", envelope(t, asMap(func(m map[string]any) { m["status"] = "done" }), EnvelopeSource, EnvelopeDetailType), "status"},
		{"cached above prompt", envelope(t, asMap(func(m map[string]any) { m["cached_tokens"] = 10 }), EnvelopeSource, EnvelopeDetailType), "cached_tokens"},
		{"zero time", envelope(t, asMap(func(m map[string]any) { m["started_at"] = "0001-01-01T00:00:00Z" }), EnvelopeSource, EnvelopeDetailType), "started_at"},
		{"model over 256 bytes", envelope(t, asMap(func(m map[string]any) { m["model"] = strings.Repeat("m", 257) }), EnvelopeSource, EnvelopeDetailType), "model of 257 bytes"},
		{"finish_reason over 64 bytes", envelope(t, asMap(func(m map[string]any) { m["finish_reason"] = strings.Repeat("f", 65) }), EnvelopeSource, EnvelopeDetailType), "finish_reason of 65 bytes"},
		{"backend over 256 bytes", envelope(t, asMap(func(m map[string]any) { m["backend"] = strings.Repeat("b", 257) }), EnvelopeSource, EnvelopeDetailType), "backend of 257 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Decode([]byte(tc.body))
			switch {
			case tc.errHas == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.errHas == "" && e != validEvent():
				t.Errorf("decoded %+v", e)
			case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
				t.Errorf("error %v, want one mentioning %q", err, tc.errHas)
			}
		})
	}
}

type recorder struct{ failOn string }

func (r recorder) RecordBatch(_ context.Context, es []Event) []error {
	errs := make([]error, len(es))
	for i, e := range es {
		if e.GenerationID == r.failOn {
			errs[i] = errors.New("store unavailable")
		}
	}
	return errs
}

func TestHandleReportsOnlyFailures(t *testing.T) {
	ok := validEvent()
	failing := validEvent()
	failing.GenerationID = "gen-RECORDFAILS"
	batch := events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: envelope(t, ok, EnvelopeSource, EnvelopeDetailType)},
		{MessageId: "m2", Body: "nope"},
		{MessageId: "m3", Body: envelope(t, failing, EnvelopeSource, EnvelopeDetailType)},
	}}
	resp, err := NewHandler(recorder{failOn: failing.GenerationID}, nil).Handle(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, f := range resp.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	if !slices.Equal(ids, []string{"m2", "m3"}) {
		t.Errorf("failures %v, want [m2 m3]", ids)
	}

	resp, _ = NewHandler(recorder{}, nil).Handle(context.Background(), events.SQSEvent{Records: batch.Records[:1]})
	if b, _ := json.Marshal(resp); string(b) != `{"batchItemFailures":[]}` {
		t.Errorf("all good: %s, want an empty list (never null)", b)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, _ = NewHandler(recorder{}, nil).Handle(ctx, events.SQSEvent{Records: batch.Records[:1]})
	if len(resp.BatchItemFailures) != 1 {
		t.Errorf("after the invocation ended: %v, want the message back", resp.BatchItemFailures)
	}
}

// streamRecord is the pipe's message for e: its usage item as the DynamoDB store writes it, as
// the NewImage of a stream record.
func streamRecord(t *testing.T, eventName string, e Event, mod func(img map[string]events.DynamoDBAttributeValue)) string {
	t.Helper()
	n := func(v int64) events.DynamoDBAttributeValue {
		return events.NewNumberAttribute(strconv.FormatInt(v, 10))
	}
	img := map[string]events.DynamoDBAttributeValue{
		"org_id": events.NewStringAttribute(e.OrgID), "generation_id": events.NewStringAttribute(e.GenerationID),
		"version": n(int64(e.Version)), "key_id": events.NewStringAttribute(e.KeyID), "model": events.NewStringAttribute(e.Model),
		"endpoint": events.NewStringAttribute(e.Endpoint), "stream": events.NewBooleanAttribute(e.Stream),
		"status": events.NewStringAttribute(string(e.Status)), "http_status": n(int64(e.HTTPStatus)),
		"finish_reason": events.NewStringAttribute(e.FinishReason), "prompt_tokens": n(e.PromptTokens),
		"cached_tokens": n(e.CachedTokens), "completion_tokens": n(e.CompletionTokens), "cost": n(int64(e.Cost)),
		"cost_usd": events.NewStringAttribute(e.Cost.String()), "estimated": events.NewBooleanAttribute(e.Estimated),
		"started_at": n(e.StartedAt.UnixNano()), "ttft_ms": n(e.TTFTMillis), "duration_ms": n(e.DurationMillis),
		"backend": events.NewStringAttribute(e.Backend), "settled_at": n(e.StartedAt.UnixNano() + 1), "day": events.NewStringAttribute(e.Day()),
	}
	if mod != nil {
		mod(img)
	}
	r := events.DynamoDBEventRecord{EventName: eventName, EventSource: "aws:dynamodb", EventID: "1", EventVersion: "1.1", AWSRegion: "us-east-1",
		Change: events.DynamoDBStreamRecord{NewImage: img, StreamViewType: "NEW_IMAGE", SequenceNumber: "100"}}
	if eventName == "REMOVE" {
		r.Change.NewImage = nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDecodeStreamRecord(t *testing.T) {
	e := validEvent()
	for _, tc := range []struct {
		name     string
		body     string
		errHas   string // "" for valid
		notFinal bool
	}{
		{"insert", streamRecord(t, "INSERT", e, nil), "", false},
		{"modify to a final status", streamRecord(t, "MODIFY", e, nil), "", false},
		{"remove", streamRecord(t, "REMOVE", e, nil), "REMOVE", true},
		{"in progress", streamRecord(t, "MODIFY", e, func(img map[string]events.DynamoDBAttributeValue) {
			img["status"] = events.NewStringAttribute("in_progress")
		}), "not a final", true},
		{"no new image", strings.Replace(streamRecord(t, "INSERT", e, nil), `"NewImage"`, `"OldImage"`, 1), "without NewImage", false},
		{"missing attributes", streamRecord(t, "INSERT", e, func(img map[string]events.DynamoDBAttributeValue) {
			delete(img, "cost")
			delete(img, "backend")
		}), "without cost, backend", false},
		{"wrong type", streamRecord(t, "INSERT", e, func(img map[string]events.DynamoDBAttributeValue) {
			img["prompt_tokens"] = events.NewStringAttribute("9")
		}), "prompt_tokens: want a DynamoDB number", false},
		{"not an integer", streamRecord(t, "INSERT", e, func(img map[string]events.DynamoDBAttributeValue) {
			img["cost"] = events.NewNumberAttribute("1.5")
		}), "not an integer", false},
		{"cost_usd disagrees", streamRecord(t, "INSERT", e, func(img map[string]events.DynamoDBAttributeValue) {
			img["cost_usd"] = events.NewStringAttribute("1.00")
		}), "disagrees", false},
		{"cost_usd empty", streamRecord(t, "INSERT", e, func(img map[string]events.DynamoDBAttributeValue) {
			img["cost_usd"] = events.NewStringAttribute("")
		}), "disagrees", false},
		{"invalid event", streamRecord(t, "INSERT", e, func(img map[string]events.DynamoDBAttributeValue) {
			img["status"] = events.NewStringAttribute("done")
		}), "status", false},
		{"unknown event name", streamRecord(t, "UPSERT", e, nil), "eventName", false},
		{"truncated", `{"eventSource":"aws:dynamodb","dynamodb":`, "neither", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.body))
			switch {
			case tc.errHas == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.errHas == "" && got != e:
				t.Errorf("decoded %+v\nwant    %+v", got, e)
			case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
				t.Errorf("error %v, want one mentioning %q", err, tc.errHas)
			case errors.Is(err, ErrNotFinal) != tc.notFinal:
				t.Errorf("error %v: ErrNotFinal %v, want %v", err, !tc.notFinal, tc.notFinal)
			}
		})
	}
	// A record that is not final is acknowledged, not redelivered.
	resp, _ := NewHandler(recorder{}, nil).Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: streamRecord(t, "REMOVE", e, nil)}, {MessageId: "m2", Body: streamRecord(t, "INSERT", e, nil)}}})
	if len(resp.BatchItemFailures) != 0 {
		t.Errorf("failures %v, want none", resp.BatchItemFailures)
	}
}
