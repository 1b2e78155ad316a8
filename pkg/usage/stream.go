package usage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/neocloud/kiln/pkg/money"
)

// StreamEventSource is the eventSource of a DynamoDB stream record.
const StreamEventSource = "aws:dynamodb"

// ErrNotFinal marks a message that holds no final usage record: a REMOVE, or an item whose
// request is still in progress. The pipe's filter keeps them off the queue; one that gets through
// is acknowledged (it has nothing to fold, and the record of the final status follows), not
// redelivered.
var ErrNotFinal = errors.New("not a final usage record")

// decodeStreamRecord reads what an EventBridge Pipe puts on the queue from the usage table's
// DynamoDB stream: the stream record itself as the message body (no envelope, no input
// template), its NewImage the usage item in DynamoDB JSON (pkg/store/dynamo writes it;
// docs/dynamodb.md lists its attributes).
func decodeStreamRecord(body []byte) (Event, error) {
	var r events.DynamoDBEventRecord
	if err := json.Unmarshal(body, &r); err != nil {
		return Event{}, fmt.Errorf("not a DynamoDB stream record: %w", err)
	}
	switch r.EventName {
	case "INSERT", "MODIFY":
	case "REMOVE":
		return Event{}, fmt.Errorf("REMOVE of a usage item: %w", ErrNotFinal)
	default:
		return Event{}, fmt.Errorf("stream record with eventName %q: want INSERT or MODIFY", r.EventName)
	}
	img := r.Change.NewImage
	if img == nil {
		return Event{}, errors.New("stream record without NewImage: the table's stream must have StreamViewType NEW_IMAGE or NEW_AND_OLD_IMAGES")
	}
	if s, ok := img["status"]; ok && s.DataType() == events.DataTypeString && s.String() == string(StatusInProgress) {
		return Event{}, fmt.Errorf("usage item %s: %w", attrText(img, "generation_id"), ErrNotFinal)
	}
	e, err := eventOfItem(img)
	if err != nil {
		return Event{}, fmt.Errorf("usage item %s: %w", attrText(img, "generation_id"), err)
	}
	if err := Validate(e); err != nil {
		return Event{}, err
	}
	return e, nil
}

// eventOfItem reads a usage item: the event's wire names, the cost as an integer number of
// picodollars (cost_usd, the same as a decimal string, must agree when present) and started_at
// in Unix nanoseconds. Every attribute of the event is required, with its type; attributes the
// store keeps for itself (settled_at, day, ...) are ignored.
func eventOfItem(img map[string]events.DynamoDBAttributeValue) (Event, error) {
	var missing, errs []string
	attr := func(name string, want events.DynamoDBDataType) (events.DynamoDBAttributeValue, bool) {
		v, ok := img[name]
		if !ok {
			missing = append(missing, name)
			return v, false
		}
		if v.DataType() != want {
			errs = append(errs, fmt.Sprintf("%s: want a DynamoDB %s", name, typeNames[want]))
			return v, false
		}
		return v, true
	}
	str := func(name string) string {
		if v, ok := attr(name, events.DataTypeString); ok {
			return v.String()
		}
		return ""
	}
	num := func(name string) int64 {
		v, ok := attr(name, events.DataTypeNumber)
		if !ok {
			return 0
		}
		n, err := strconv.ParseInt(v.Number(), 10, 64)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %q is not an integer", name, v.Number()))
		}
		return n
	}
	boolean := func(name string) bool {
		if v, ok := attr(name, events.DataTypeBoolean); ok {
			return v.Boolean()
		}
		return false
	}
	e := Event{
		Version:          int(num("version")),
		GenerationID:     str("generation_id"),
		OrgID:            str("org_id"),
		KeyID:            str("key_id"),
		Model:            str("model"),
		Endpoint:         str("endpoint"),
		Stream:           boolean("stream"),
		Status:           Status(str("status")),
		HTTPStatus:       int(num("http_status")),
		FinishReason:     str("finish_reason"),
		PromptTokens:     num("prompt_tokens"),
		CachedTokens:     num("cached_tokens"),
		CompletionTokens: num("completion_tokens"),
		Cost:             money.Amount(num("cost")),
		Estimated:        boolean("estimated"),
		TTFTMillis:       num("ttft_ms"),
		DurationMillis:   num("duration_ms"),
		Backend:          str("backend"),
	}
	if started := num("started_at"); started != 0 {
		e.StartedAt = time.Unix(0, started).UTC()
	}
	if v, ok := img["cost_usd"]; ok && v.DataType() == events.DataTypeString {
		if usd, err := money.Parse(v.String()); err != nil || usd != e.Cost {
			errs = append(errs, fmt.Sprintf("cost_usd %q disagrees with cost %s", v.String(), e.Cost))
		}
	}
	if len(missing) > 0 {
		errs = append([]string{"without " + strings.Join(missing, ", ")}, errs...)
	}
	if len(errs) > 0 {
		return Event{}, errors.New(strings.Join(errs, "; "))
	}
	return e, nil
}

// attrText is a string attribute for messages, bounded, or "?".
func attrText(img map[string]events.DynamoDBAttributeValue, name string) string {
	v, ok := img[name]
	if !ok || v.DataType() != events.DataTypeString {
		return "?"
	}
	s := v.String()
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strconv.Quote(s)
}

// typeNames are the attribute types a usage item holds, as messages name them.
var typeNames = map[events.DynamoDBDataType]string{
	events.DataTypeString:  "string (S)",
	events.DataTypeNumber:  "number (N)",
	events.DataTypeBoolean: "boolean (BOOL)",
}

// isStreamRecord tells a stream record from an EventBridge envelope by its eventSource member.
func isStreamRecord(body []byte) bool {
	var probe struct {
		EventSource string `json:"eventSource"`
	}
	return bytes.Contains(body, []byte(`"eventSource"`)) && json.Unmarshal(body, &probe) == nil && probe.EventSource == StreamEventSource
}
