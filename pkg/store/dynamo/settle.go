package dynamo

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Settle ends a request in one TransactWriteItems of up to three items:
//
//  1. the org item: REMOVE leases.<holder>, balance = balance - cost, available = available +
//     (reserved - cost), on the condition that the lease is still held with its reservation;
//  2. the usage item, put on the condition that the organization has none for this generation;
//  3. the debit, a ledger entry keyed by the generation id, put on the same kind of condition
//     (zero-cost requests write no ledger entry).
//
// A cost above the lease's reservation is capped at it. When the lease is no longer held (it
// expired and an admission purged it, giving its reservation back), the transaction is tried again
// without the lease: balance and available both less the cost, on the condition that as much is
// available, and otherwise capped at what is: the balance never goes below zero. A generation
// already settled fails condition 2 and the whole transaction changes nothing: AlreadyApplied.
// The usage item carries a token drawn once per call, so that when a try of this very call
// committed and its response was lost (the SDK then retries, and a server that ignores
// ClientRequestToken, such as moto, runs the transaction again), the failed condition's item shows
// this call's own token and the settlement is reported as applied, not as a replay.
func (s *Store) Settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	res, err := s.settle(ctx, st)
	return res, store.Wrapf(err, "settle %s of %s", st.Event.GenerationID, st.Event.OrgID)
}

// settleRounds bounds the tries of one settlement: with its lease, without it, and capped.
const settleRounds = 3

func (s *Store) settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	now, err := st.Check()
	if err != nil {
		return store.SettleResult{}, err
	}
	e := st.Event
	token := rand.Text()
	cost, off := e.Cost, money.Amount(0)
	held := st.Lease.HolderID != ""
	for range settleRounds {
		e.Cost, e.Estimated = cost, st.Event.Estimated || off > 0
		usageItem, err := eventItem(e, now, token)
		if err != nil {
			return store.SettleResult{}, err
		}
		c, err := s.transact(ctx, func() []types.TransactWriteItem {
			items := []types.TransactWriteItem{s.settleOrg(st.Lease, e.OrgID, cost, held)}
			items = append(items, types.TransactWriteItem{Put: &types.Put{
				TableName:                           &s.tables.Usage,
				Item:                                usageItem,
				ConditionExpression:                 aws.String("attribute_not_exists(generation_id)"),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}})
			if cost > 0 {
				debit := store.LedgerEntry{ID: e.GenerationID, OrgID: e.OrgID, Kind: store.EntryDebit, Amount: -cost, Note: e.Model}
				items = append(items, s.ledgerPut(debit, now))
			}
			return items
		})
		if err != nil {
			return store.SettleResult{}, err
		}
		if c == nil {
			return store.SettleResult{WrittenOff: off}, nil
		}
		if failed, recorded := c.failed(1); failed {
			if recorded != nil {
				d := ddbitem.NewReader(recorded)
				if d.Has("settlement_token") && d.Str("settlement_token") == token {
					return store.SettleResult{WrittenOff: off}, nil // an earlier try of this call committed
				}
			}
			return store.SettleResult{AlreadyApplied: true}, nil
		}
		if failed, org := c.failed(0); failed {
			if org == nil {
				return store.SettleResult{}, store.ErrNotFound
			}
			d := ddbitem.NewReader(org)
			available := d.Num("available")
			if err := d.Err(); err != nil {
				return store.SettleResult{}, fmt.Errorf("org item: %w", err)
			}
			limit := money.Amount(available)
			if held {
				l, still := leaseMap(d, "leases")[st.Lease.HolderID]
				switch {
				case !still:
					held = false // the lease lapsed and gave its reservation back: settle without it
				case l.reserved != int64(st.Lease.Reserved):
					return store.SettleResult{}, fmt.Errorf("lease %s is held with another reservation than %s", st.Lease.HolderID, st.Lease.Reserved)
				default:
					limit += st.Lease.Reserved // too little available beyond the reservation
				}
			}
			cost, off = store.Capped(st.Event.Cost, limit)
			continue
		}
		if failed, _ := c.failed(2); failed && cost > 0 {
			return store.SettleResult{}, fmt.Errorf("ledger entry %s exists but is no debit of this generation: %w", e.GenerationID, store.ErrExists)
		}
		return store.SettleResult{}, fmt.Errorf("transaction cancelled: %v", c)
	}
	return store.SettleResult{}, fmt.Errorf("the organization's item kept changing during %d rounds", settleRounds)
}

// settleOrg is a settlement's write of the org item: with the lease, it releases the lease and
// its reservation and debits cost (what the reservation does not cover on the condition that it
// is available); without it, it debits cost from the balance and from what is available, on the
// condition that as much is available (a check of the organization alone when cost is zero).
// The write of a zero cost binds no values: DynamoDB refuses values an expression does not use.
func (s *Store) settleOrg(lease store.Lease, orgID string, cost money.Amount, held bool) types.TransactWriteItem {
	u := &types.Update{
		TableName:                           &s.tables.Orgs,
		Key:                                 orgKey(orgID),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if lease.HolderID != "" {
		u.ExpressionAttributeNames = names("#holder", lease.HolderID)
	}
	if held {
		cond := "leases.#holder.r = :reserved"
		u.ExpressionAttributeValues = item{":cost": ddbitem.N(int64(cost)), ":back": ddbitem.N(int64(lease.Reserved - cost)),
			":reserved": ddbitem.N(int64(lease.Reserved))}
		if excess := cost - lease.Reserved; excess > 0 {
			cond += " AND available >= :excess"
			u.ExpressionAttributeValues[":excess"] = ddbitem.N(int64(excess))
		}
		u.UpdateExpression = aws.String("REMOVE leases.#holder SET balance = balance - :cost, available = available + :back")
		u.ConditionExpression = aws.String(cond)
		return types.TransactWriteItem{Update: u}
	}
	cond := "attribute_exists(pk)"
	if lease.HolderID != "" {
		cond += " AND attribute_not_exists(leases.#holder)"
	}
	if cost == 0 {
		return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{TableName: u.TableName, Key: u.Key,
			ConditionExpression: aws.String(cond), ExpressionAttributeNames: u.ExpressionAttributeNames,
			ReturnValuesOnConditionCheckFailure: u.ReturnValuesOnConditionCheckFailure}}
	}
	u.UpdateExpression = aws.String("SET balance = balance - :cost, available = available - :cost")
	u.ConditionExpression = aws.String(cond + " AND available >= :cost")
	u.ExpressionAttributeValues = item{":cost": ddbitem.N(int64(cost))}
	return types.TransactWriteItem{Update: u}
}

// eventItem is the usage item of an event (usage.EventItem) with what settlement keeps for
// itself: when it settled and the token of the call that wrote it.
func eventItem(e usage.Event, settled int64, token string) (item, error) {
	if _, err := store.UnixNanos("started_at", e.StartedAt); err != nil {
		return nil, err
	}
	it := usage.EventItem(e)
	it["settled_at"] = ddbitem.N(settled)
	it["settlement_token"] = ddbitem.S(token)
	return it, nil
}

// Generation returns the recorded event of one generation of this organization: one strongly
// consistent read keyed by both, so another organization's generation is simply not found.
func (s *Store) Generation(ctx context.Context, orgID, generationID string) (usage.Event, error) {
	e, err := s.generation(ctx, orgID, generationID)
	return e, store.Wrapf(err, "generation %s of %s", generationID, orgID)
}

func (s *Store) generation(ctx context.Context, orgID, generationID string) (usage.Event, error) {
	if orgID == "" || generationID == "" {
		return usage.Event{}, store.ErrNotFound
	}
	it, err := s.get(ctx, &s.tables.Usage, keyOf("org_id", orgID, "generation_id", generationID))
	if err != nil {
		return usage.Event{}, err
	}
	return usage.DecodeItem(it)
}

// Usage lists an organization's events started in [from, to), by start time then generation id,
// strongly consistent (usageStarted says how the table's key finds them).
func (s *Store) Usage(ctx context.Context, orgID string, from, to time.Time) ([]usage.Event, error) {
	events, err := s.usage(ctx, orgID, from, to)
	return events, store.Wrapf(err, "usage of %s", orgID)
}

func (s *Store) usage(ctx context.Context, orgID string, from, to time.Time) ([]usage.Event, error) {
	f, t, err := store.UnixNanosRange(from, to)
	if err != nil {
		return nil, err
	}
	var query *dynamodb.QueryInput
	if f < t {
		query = s.usageStarted(orgID, f, t-1)
	}
	// The key orders by the millisecond of the start, then by the id's random part.
	return listOrg(ctx, s, orgID, query, usage.DecodeItem, func(a, b usage.Event) int {
		return cmp.Or(a.StartedAt.Compare(b.StartedAt), strings.Compare(a.GenerationID, b.GenerationID))
	})
}

// usageStarted is a Query of the organization's usage items that started in [first, last], Unix
// nanoseconds, strongly consistent. A generation id is "gen-" and a ULID of the millisecond its
// request started (the gateway's newGenerationID and the event's started_at are one clock
// reading), so the table's own sort key orders an organization's usage by start, to the
// millisecond: the ids of the milliseconds of first to last hold every item that started in
// [first, last], and the filter on started_at drops those that started in the same milliseconds
// but outside it.
func (s *Store) usageStarted(orgID string, first, last int64) *dynamodb.QueryInput {
	lo, hi := usage.GenerationIDRange(store.FromUnixNanos(first), store.FromUnixNanos(last))
	return &dynamodb.QueryInput{
		TableName:              &s.tables.Usage,
		KeyConditionExpression: aws.String("org_id = :org AND generation_id BETWEEN :lo AND :hi"),
		FilterExpression:       aws.String("started_at BETWEEN :first AND :last"),
		ExpressionAttributeValues: item{
			":org": ddbitem.S(orgID), ":lo": ddbitem.S(lo), ":hi": ddbitem.S(hi), ":first": ddbitem.N(first), ":last": ddbitem.N(last),
		},
		ConsistentRead: aws.Bool(true),
	}
}
