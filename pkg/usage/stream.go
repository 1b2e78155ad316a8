package usage

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
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
// template), its NewImage the usage item (EventItem is its shape; docs/dynamodb.md lists its
// attributes).
func decodeStreamRecord(r message) (Event, error) {
	switch r.EventName {
	case "INSERT", "MODIFY":
	case "REMOVE":
		return Event{}, fmt.Errorf("REMOVE of a usage item: %w", ErrNotFinal)
	default:
		return Event{}, fmt.Errorf("stream record with eventName %q: want INSERT or MODIFY", r.EventName)
	}
	if r.Change.NewImage == nil {
		return Event{}, errors.New("stream record without NewImage: the table's stream must have StreamViewType NEW_IMAGE or NEW_AND_OLD_IMAGES")
	}
	it, err := r.Change.NewImage.Item()
	if err != nil {
		return Event{}, fmt.Errorf("not a DynamoDB stream record: NewImage: %w", err)
	}
	if s, ok := it["status"].(*types.AttributeValueMemberS); ok && s.Value == string(StatusInProgress) {
		return Event{}, fmt.Errorf("usage item %s: %w", attrText(it, "generation_id"), ErrNotFinal)
	}
	e, err := DecodeItem(it)
	if err == nil {
		err = costAgrees(it, e.Cost)
	}
	if err != nil {
		return Event{}, fmt.Errorf("usage item %s: %w", attrText(it, "generation_id"), err)
	}
	if err := Validate(e); err != nil {
		return Event{}, err
	}
	return e, nil
}

// costAgrees checks the usage item's cost_usd, when present, against its cost in picodollars.
func costAgrees(it ddbitem.Item, cost money.Amount) error {
	v, ok := it["cost_usd"].(*types.AttributeValueMemberS)
	if !ok {
		return nil
	}
	if usd, err := money.Parse(v.Value); err != nil || usd != cost {
		return fmt.Errorf("cost_usd %q disagrees with cost %s", v.Value, cost)
	}
	return nil
}

// attrText is a string attribute for messages, bounded, or "?".
func attrText(it ddbitem.Item, name string) string {
	v, ok := it[name].(*types.AttributeValueMemberS)
	if !ok {
		return "?"
	}
	s := v.Value
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strconv.Quote(s)
}
