package dynamo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/neocloud/kiln/pkg/store"
)

// Cancellation reason codes that the store decides on.
const (
	reasonConditionFailed = "ConditionalCheckFailed"
	reasonConflict        = "TransactionConflict"
)

// maxConflictRetries bounds how often one call retries a transaction that collided with another
// transaction on the same items. Every admission and settlement of an organization touches its
// organization item, so a busy organization's transactions collide now and then; each retry
// waits a random, growing pause first.
const maxConflictRetries = 40

// cancelled is a transaction that DynamoDB cancelled because a condition failed. Its reasons are
// in the order of the transaction's items; Item is the item as it was, where the item asked for
// ReturnValuesOnConditionCheckFailure ALL_OLD and existed.
type cancelled struct {
	reasons []types.CancellationReason
}

// failed reports whether the condition of the i-th item failed, with that item as it was (nil
// when the item did not exist).
func (c *cancelled) failed(i int) (bool, item) {
	if c == nil || i >= len(c.reasons) {
		return false, nil
	}
	r := c.reasons[i]
	if aws.ToString(r.Code) != reasonConditionFailed {
		return false, nil
	}
	return true, r.Item
}

func (c *cancelled) String() string {
	var codes []string
	for _, r := range c.reasons {
		codes = append(codes, aws.ToString(r.Code))
	}
	return fmt.Sprint(codes)
}

// transact runs one TransactWriteItems, built afresh by build for each try so that each try gets
// its own ClientRequestToken. It returns (nil, nil) when the transaction committed and a
// *cancelled when a condition failed. Collisions with other transactions (and items throttled
// inside a transaction, which the SDK does not retry either) are retried here; the
// SDK's own retries (throttling, network errors) happen inside each try. No condition of this
// store's transactions depends on whether a try before it committed, so a retry after a lost
// response is decided by the same conditions as the first try.
func (s *Store) transact(ctx context.Context, build func() []types.TransactWriteItem) (*cancelled, error) {
	for try := 0; ; try++ {
		_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: build()})
		if err == nil {
			return nil, nil
		}
		var canceled *types.TransactionCanceledException
		var conflict *types.TransactionConflictException
		var inProgress *types.TransactionInProgressException
		switch {
		case errors.As(err, &canceled):
			if !hasReason(canceled.CancellationReasons, reasonConflict, "ThrottlingError", "ProvisionedThroughputExceeded") {
				return &cancelled{reasons: canceled.CancellationReasons}, nil
			}
		case errors.As(err, &conflict), errors.As(err, &inProgress):
		default:
			return nil, err
		}
		if try >= maxConflictRetries {
			return nil, fmt.Errorf("transaction kept colliding with others after %d tries: %w", try+1, err)
		}
		if err := pause(ctx, try); err != nil {
			return nil, err
		}
	}
}

// hasReason reports whether any item was cancelled for one of codes.
func hasReason(reasons []types.CancellationReason, codes ...string) bool {
	for _, r := range reasons {
		if slices.Contains(codes, aws.ToString(r.Code)) {
			return true
		}
	}
	return false
}

// pause waits a random time of up to 1 ms × 2^try, at most 50 ms, or until ctx ends.
func pause(ctx context.Context, try int) error {
	ceiling := min(time.Millisecond<<min(try, 6), 50*time.Millisecond)
	t := time.NewTimer(rand.N(ceiling) + 100*time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// get reads one item, strongly consistent; store.ErrNotFound when there is none.
func (s *Store) get(ctx context.Context, table *string, key item) (item, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	if out.Item == nil {
		return nil, store.ErrNotFound
	}
	return out.Item, nil
}

// conditionFailed reports whether err is a single-item write's failed condition, with the item
// as it was when the request asked for it.
func conditionFailed(err error) (bool, item) {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return true, ccf.Item
	}
	return false, nil
}

// write runs one single-item write, retrying while it collides with a transaction in progress on
// the same item (TransactionConflictException, which the SDK does not retry).
func write(ctx context.Context, do func() error) error {
	for try := 0; ; try++ {
		err := do()
		var conflict *types.TransactionConflictException
		if !errors.As(err, &conflict) || try >= maxConflictRetries {
			return err
		}
		if err := pause(ctx, try); err != nil {
			return err
		}
	}
}

// update runs one UpdateItem through write.
func (s *Store) update(ctx context.Context, in *dynamodb.UpdateItemInput) error {
	return write(ctx, func() error {
		_, err := s.db.UpdateItem(ctx, in)
		return err
	})
}

// itemTooLarge reports whether err is DynamoDB refusing a write that would make an item larger
// than 400 KB.
func itemTooLarge(err error) bool {
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == "ValidationException" &&
		strings.Contains(strings.ToLower(api.ErrorMessage()), "item size")
}
