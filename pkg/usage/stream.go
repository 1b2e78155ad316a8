package usage

import (
	"errors"
	"fmt"

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
	// Messages name the item by its generation id, bounded: the id is not validated yet.
	f := ddbitem.NewReader(it)
	id := fmt.Sprintf("%.80q", f.OptStr("generation_id"))
	if f.OptStr("status") == string(StatusInProgress) {
		return Event{}, fmt.Errorf("usage item %s: %w", id, ErrNotFinal)
	}
	e, err := DecodeItem(it)
	if usd, ok := it["cost_usd"].(*types.AttributeValueMemberS); ok && err == nil {
		// cost_usd is for people reading the table; when written, even empty, it must say what
		// cost says.
		if c, perr := money.Parse(usd.Value); perr != nil || c != e.Cost {
			err = fmt.Errorf("cost_usd %q disagrees with cost %s", usd.Value, e.Cost)
		}
	}
	if err != nil {
		return Event{}, fmt.Errorf("usage item %s: %w", id, err)
	}
	if err := Validate(e); err != nil {
		return Event{}, err
	}
	return e, nil
}
