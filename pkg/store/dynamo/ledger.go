package dynamo

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// ledgerPut is the put of a ledger entry's item, on the condition that the organization has no
// entry of its ID: the organization and the entry ID are the item's key, so that an ID is written
// once per organization (a debit's ID is its generation id). The amount is exact twice over:
// picodollars in a number, and the same as a decimal USD string for people reading exports.
func (s *Store) ledgerPut(e store.LedgerEntry, at int64) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{
		TableName: &s.tables.Ledger,
		Item: item{
			"org_id":     ddbitem.S(e.OrgID),
			"entry_id":   ddbitem.S(e.ID),
			"kind":       ddbitem.S(string(e.Kind)),
			"amount":     ddbitem.N(int64(e.Amount)),
			"amount_usd": ddbitem.S(e.Amount.String()),
			"note":       ddbitem.S(e.Note),
			"at":         ddbitem.N(at),
			"at_utc":     ddbitem.S(store.FromUnixNanos(at).Format(time.RFC3339Nano)),
		},
		ConditionExpression: aws.String("attribute_not_exists(entry_id)"),
	}}
}

// AddEntry applies a top-up (a positive amount) or an adjustment (any non-zero amount) in one
// transaction: the entry is put on the condition that its ID is new for the organization, and
// the balance is changed on the condition that the organization exists. ErrNotFound for an
// unknown organization, ErrExists for a taken ID (then nothing changes).
func (s *Store) AddEntry(ctx context.Context, e store.LedgerEntry) error {
	return store.Wrapf(s.addEntry(ctx, e), "add entry %s to %s", e.ID, e.OrgID)
}

func (s *Store) addEntry(ctx context.Context, e store.LedgerEntry) error {
	at, err := store.CheckEntry(e)
	if err != nil {
		return err
	}
	c, err := s.transact(ctx, func() []types.TransactWriteItem {
		return []types.TransactWriteItem{
			{Update: &types.Update{
				TableName:                 &s.tables.Orgs,
				Key:                       orgKey(e.OrgID),
				UpdateExpression:          aws.String("SET balance = balance + :amount, available = available + :amount"),
				ConditionExpression:       aws.String("attribute_exists(balance)"),
				ExpressionAttributeValues: item{":amount": ddbitem.N(int64(e.Amount))},
			}},
			s.ledgerPut(e, at),
		}
	})
	if err != nil {
		return err
	}
	if c != nil {
		if failed, _ := c.failed(0); failed {
			return store.ErrNotFound
		}
		if failed, _ := c.failed(1); failed {
			return store.ErrExists
		}
		return fmt.Errorf("transaction cancelled: %v", c)
	}
	return nil
}

func decodeEntry(it item) (store.LedgerEntry, error) {
	d := ddbitem.NewReader(it)
	e := store.LedgerEntry{
		ID:     d.Str("entry_id"),
		OrgID:  d.Str("org_id"),
		Kind:   store.EntryKind(d.Str("kind")),
		Amount: money.Amount(d.Num("amount")),
		Note:   d.Str("note"),
		At:     store.FromUnixNanos(d.Num("at")),
	}
	return e, d.Err()
}

// Ledger lists an organization's ledger entries by time, then ID: a strongly consistent query of
// the organization's partition, ordered here.
func (s *Store) Ledger(ctx context.Context, orgID string) ([]store.LedgerEntry, error) {
	entries, err := listOrg(ctx, s, orgID, &dynamodb.QueryInput{
		TableName:                 &s.tables.Ledger,
		KeyConditionExpression:    aws.String("org_id = :org"),
		ExpressionAttributeValues: item{":org": ddbitem.S(orgID)},
		ConsistentRead:            aws.Bool(true),
	}, decodeEntry, func(a, b store.LedgerEntry) int {
		return cmp.Or(a.At.Compare(b.At), strings.Compare(a.ID, b.ID))
	})
	return entries, store.Wrapf(err, "ledger of %s", orgID)
}
