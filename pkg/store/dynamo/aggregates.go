package dynamo

import (
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// The aggregates table's items (docs/dynamodb.md):
//
//	day × model roll-up   pk = org ID,          sk = "day#" + YYYY-MM-DD + "#" + model
//	month roll-up         pk = org ID,          sk = "month#" + YYYY-MM
//	generation marker     pk = "gen#" + gen ID, sk = org ID
//
// The markers have partition keys of their own, so that folding spreads over the table instead
// of piling onto each organization's partition.
const (
	dayPrefix    = "day#"
	monthPrefix  = "month#"
	markerPrefix = "gen#"
)

// Fold is FoldBatch of one delta: one TransactWriteItems of the marker of the generation, put if
// absent, and an ADD of the totals to the day × model and the month roll-up items (which ADD
// creates). A marker that exists cancels the transaction, and nothing changes. Every number is an
// exact integer.
func (s *Store) Fold(ctx context.Context, d usage.Delta) (bool, error) {
	applied, err := s.FoldBatch(ctx, []usage.Delta{d})
	if err != nil {
		return false, err
	}
	return applied[0], nil
}

// maxTransactItems is the most items one TransactWriteItems may hold.
const maxTransactItems = 100

// FoldBatch folds many deltas in as few TransactWriteItems as fit in DynamoDB's 100 items: each
// puts the markers of its generations, if absent, and adds the sum of their totals once to each
// distinct day × model and month roll-up item they touch. Every transactional write costs two
// write units per KB and item, so a batch of events of one organization, day and model costs
// about two units per event (its marker) where Fold costs six. A marker that exists cancels the
// transaction; its cancellation reason names the generation already folded, which is left out
// and the rest is tried again, so that each generation is still added once. A generation twice
// in ds is folded once (the second reports false).
//
// It returns, in the order of ds, whether each delta changed the aggregates. On an error it
// returns the results of the deltas handled before it, a prefix of ds; the rest were not folded
// by this call.
func (s *Store) FoldBatch(ctx context.Context, ds []usage.Delta) ([]bool, error) {
	applied := make([]bool, 0, len(ds))
	for len(applied) < len(ds) {
		chunk, err := s.foldChunk(ctx, ds[len(applied):])
		applied = append(applied, chunk...)
		if err != nil {
			return applied, err
		}
	}
	return applied, nil
}

// rollupRef is one roll-up item a transaction adds to, with the sum it adds.
type rollupRef struct {
	orgID, sk string
	totals    usage.Totals
}

// foldChunk folds the longest prefix of ds whose markers and roll-ups fit in one transaction and
// returns its results.
func (s *Store) foldChunk(ctx context.Context, ds []usage.Delta) ([]bool, error) {
	type markerKey struct{ gen, org string }
	seen := map[markerKey]bool{}
	rollups := map[string]bool{} // org + sk of the roll-ups the chunk touches
	var pending []int            // the chunk's deltas whose markers go in the transaction
	n := 0
	for ; n < len(ds); n++ {
		d := ds[n]
		if err := store.CheckDelta(d); err != nil {
			if n == 0 {
				return nil, err
			}
			break // the deltas before it are folded first
		}
		k := markerKey{d.GenerationID, d.OrgID}
		if seen[k] {
			continue // no two items of a transaction may be the same item: folded with its first
		}
		added := 0
		for _, sk := range []string{dayKey(d), monthKey(d)} {
			if !rollups[d.OrgID+"\x00"+sk] {
				added++
			}
		}
		if len(pending)+1+len(rollups)+added > maxTransactItems {
			break
		}
		seen[k] = true
		rollups[d.OrgID+"\x00"+dayKey(d)], rollups[d.OrgID+"\x00"+monthKey(d)] = true, true
		pending = append(pending, n)
	}
	applied := make([]bool, n)
	for len(pending) > 0 {
		refs, err := sumRollups(ds, pending)
		if err != nil {
			return nil, err
		}
		c, err := s.transact(ctx, func() []types.TransactWriteItem {
			items := make([]types.TransactWriteItem, 0, len(pending)+len(refs))
			for _, i := range pending {
				items = append(items, s.marker(ds[i]))
			}
			for _, r := range refs {
				items = append(items, s.rollupAdd(r.orgID, r.sk, r.totals))
			}
			return items
		})
		if err != nil {
			return nil, fmt.Errorf("fold %d generations from %s: %w", len(pending), ds[pending[0]].GenerationID, err)
		}
		if c == nil {
			for _, i := range pending {
				applied[i] = true
			}
			break
		}
		left := pending[:0:0]
		for k, i := range pending {
			if failed, _ := c.failed(k); !failed {
				left = append(left, i)
			} // else folded before: its marker exists, and it adds nothing now
		}
		if len(left) == len(pending) {
			return nil, fmt.Errorf("fold %d generations from %s: transaction cancelled: %v", len(pending), ds[pending[0]].GenerationID, c)
		}
		pending = left
	}
	return applied, nil
}

// sumRollups adds up the totals of ds[pending] per roll-up item, in the order they first appear.
func sumRollups(ds []usage.Delta, pending []int) ([]rollupRef, error) {
	var refs []rollupRef
	at := map[string]int{}
	for _, i := range pending {
		d := ds[i]
		for _, sk := range []string{dayKey(d), monthKey(d)} {
			key := d.OrgID + "\x00" + sk
			j, ok := at[key]
			if !ok {
				j = len(refs)
				at[key] = j
				refs = append(refs, rollupRef{orgID: d.OrgID, sk: sk})
			}
			if err := refs[j].totals.Add(d.Totals); err != nil {
				return nil, fmt.Errorf("fold %s of %s: roll-up %s: %w", d.GenerationID, d.OrgID, sk, err)
			}
		}
	}
	return refs, nil
}

func dayKey(d usage.Delta) string   { return dayPrefix + d.Day + "#" + d.Model }
func monthKey(d usage.Delta) string { return monthPrefix + d.Month }

// marker is the put of a generation's marker, on the condition that it is absent.
func (s *Store) marker(d usage.Delta) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{
		TableName: &s.tables.Aggregates,
		Item: item{
			"pk": ddbitem.S(markerPrefix + d.GenerationID), "sk": ddbitem.S(d.OrgID),
			"org_id": ddbitem.S(d.OrgID), "generation_id": ddbitem.S(d.GenerationID), "day": ddbitem.S(d.Day),
			"cost": ddbitem.N(int64(d.Cost)),
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	}}
}

// rollupAdd is the ADD of t to the roll-up item sk of an organization, which it creates when
// absent, with the attributes a reader needs (org_id, and day and model or month) set.
func (s *Store) rollupAdd(orgID, sk string, t usage.Totals) types.TransactWriteItem {
	// Every attribute goes through a name placeholder: day and month are reserved words.
	n := names("#org", "org_id", "#requests", "requests", "#prompt", "prompt_tokens", "#cached", "cached_tokens",
		"#completion", "completion_tokens", "#cost", "cost")
	v := item{":org": ddbitem.S(orgID), ":requests": ddbitem.N(t.Requests), ":prompt": ddbitem.N(t.PromptTokens),
		":cached": ddbitem.N(t.CachedTokens), ":completion": ddbitem.N(t.CompletionTokens), ":cost": ddbitem.N(int64(t.Cost))}
	expr := "SET #org = :org, #month = :month"
	if rest, ok := strings.CutPrefix(sk, dayPrefix); ok {
		day, model, _ := strings.Cut(rest, "#")
		expr = "SET #org = :org, #day = :day, #model = :model"
		n["#day"], n["#model"], v[":day"], v[":model"] = "day", "model", ddbitem.S(day), ddbitem.S(model)
	} else {
		n["#month"], v[":month"] = "month", ddbitem.S(strings.TrimPrefix(sk, monthPrefix))
	}
	return types.TransactWriteItem{Update: &types.Update{
		TableName:                 &s.tables.Aggregates,
		Key:                       keyOf("pk", orgID, "sk", sk),
		UpdateExpression:          aws.String(expr + " ADD #requests :requests, #prompt :prompt, #cached :cached, #completion :completion, #cost :cost"),
		ExpressionAttributeNames:  n,
		ExpressionAttributeValues: v,
	}}
}

// DailyRollups queries the organization's partition for the day items from..to.
func (s *Store) DailyRollups(ctx context.Context, orgID, fromDay, toDay string) ([]usage.Rollup, error) {
	// '$' sorts right after '#', so the upper bound covers every model of the last day.
	rs, err := s.rollups(ctx, orgID, dayPrefix+fromDay, dayPrefix+toDay+"$")
	return rs, store.Wrapf(err, "daily roll-ups of %s", orgID)
}

// MonthlyRollups queries the organization's partition for the month items from..to.
func (s *Store) MonthlyRollups(ctx context.Context, orgID, fromMonth, toMonth string) ([]usage.Rollup, error) {
	rs, err := s.rollups(ctx, orgID, monthPrefix+fromMonth, monthPrefix+toMonth)
	return rs, store.Wrapf(err, "monthly roll-ups of %s", orgID)
}

func (s *Store) rollups(ctx context.Context, orgID, from, to string) ([]usage.Rollup, error) {
	var query *dynamodb.QueryInput
	if from <= to {
		query = s.rollupQuery(orgID, from, to)
	}
	return listOrg(ctx, s, orgID, query, func(it item) (usage.Rollup, error) {
		d := ddbitem.NewReader(it)
		r := usage.Rollup{OrgID: orgID}
		if d.Has("month") {
			r.Month = d.Str("month")
		} else {
			r.Day, r.Model = d.Str("day"), d.Str("model")
		}
		r.Requests = d.Num("requests")
		r.PromptTokens = d.Num("prompt_tokens")
		r.CachedTokens = d.Num("cached_tokens")
		r.CompletionTokens = d.Num("completion_tokens")
		r.Cost = money.Amount(d.Num("cost"))
		return r, d.Err()
	}, nil)
}

// rollupQuery is a strongly consistent Query of the organization's roll-up items from..to (sort
// keys, both included).
func (s *Store) rollupQuery(orgID, from, to string) *dynamodb.QueryInput {
	return &dynamodb.QueryInput{
		TableName:                 &s.tables.Aggregates,
		KeyConditionExpression:    aws.String("pk = :org AND sk BETWEEN :from AND :to"),
		ExpressionAttributeValues: item{":org": ddbitem.S(orgID), ":from": ddbitem.S(from), ":to": ddbitem.S(to)},
		ConsistentRead:            aws.Bool(true),
	}
}

var _ store.Store = (*Store)(nil)
