package dynamo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/store"
)

// The reads of finance's scheduled reconciliation (pkg/finance.ReconcileTables): raw items,
// decoded there exactly as the items of an export are. Every read is a paged Query of one
// organization's partition, except the list of organizations.

// OrgIDs lists every organization's ID: a Scan of the organizations table that returns only the
// keys of the organization items (the table holds a few items per organization).
func (s *Store) OrgIDs(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.scanOrgs(ctx, aws.String("pk"), func(it item) error {
		if pk, ok := it["pk"].(*types.AttributeValueMemberS); ok {
			ids = append(ids, pk.Value)
		}
		return nil
	})
	return ids, store.Wrapf(err, "list organizations")
}

// UsageItems hands fn the organization's usage items that started in [from, to), strongly
// consistent, in the order of their generation ids (usageStarted).
func (s *Store) UsageItems(ctx context.Context, orgID string, from, to time.Time, fn func(map[string]types.AttributeValue) error) error {
	f, t, err := store.UnixNanosRange(from, to)
	if err != nil {
		return err
	}
	if f >= t {
		return nil
	}
	return s.queryItems(ctx, s.usageStarted(orgID, f, t-1), fn)
}

// LedgerItems hands fn the organization's ledger items whose entry IDs lie in [fromID, toID],
// strongly consistent.
func (s *Store) LedgerItems(ctx context.Context, orgID, fromID, toID string, fn func(map[string]types.AttributeValue) error) error {
	if fromID > toID {
		return nil
	}
	return s.queryItems(ctx, &dynamodb.QueryInput{
		TableName:                 &s.tables.Ledger,
		KeyConditionExpression:    aws.String("org_id = :org AND entry_id BETWEEN :from AND :to"),
		ExpressionAttributeValues: item{":org": ddbitem.S(orgID), ":from": ddbitem.S(fromID), ":to": ddbitem.S(toID)},
		ConsistentRead:            aws.Bool(true),
	}, fn)
}

// DayRollupItems hands fn the organization's day × model roll-up items of the days
// fromDay..toDay, strongly consistent.
func (s *Store) DayRollupItems(ctx context.Context, orgID, fromDay, toDay string, fn func(map[string]types.AttributeValue) error) error {
	if fromDay > toDay {
		return nil
	}
	// '$' sorts right after '#', so the upper bound covers every model of the last day.
	return s.queryItems(ctx, s.rollupQuery(orgID, dayPrefix+fromDay, dayPrefix+toDay+"$"), fn)
}

func (s *Store) queryItems(ctx context.Context, in *dynamodb.QueryInput, fn func(map[string]types.AttributeValue) error) error {
	err := eachItem(ctx, dynamodb.NewQueryPaginator(s.db, in), func(page *dynamodb.QueryOutput) []item { return page.Items }, fn)
	return store.Wrapf(err, "query %s", aws.ToString(in.TableName))
}

// MarkerItems hands fn the aggregates' generation markers of the organization's generations
// that have one: BatchGetItem, 100 keys a call, unprocessed keys asked again.
func (s *Store) MarkerItems(ctx context.Context, orgID string, generationIDs []string, fn func(map[string]types.AttributeValue) error) error {
	for batch := range slices.Chunk(generationIDs, 100) {
		keys := make([]map[string]types.AttributeValue, 0, len(batch))
		for _, gen := range batch {
			keys = append(keys, keyOf("pk", markerPrefix+gen, "sk", orgID))
		}
		req := map[string]types.KeysAndAttributes{s.tables.Aggregates: {Keys: keys, ConsistentRead: aws.Bool(true)}}
		for try := 0; len(req) > 0; try++ {
			if try > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Duration(min(try, 10)) * 50 * time.Millisecond):
				}
			}
			out, err := s.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return fmt.Errorf("markers of %s: %w", orgID, err)
			}
			for _, it := range out.Responses[s.tables.Aggregates] {
				if err := fn(it); err != nil {
					return err
				}
			}
			req = out.UnprocessedKeys
		}
	}
	return nil
}
