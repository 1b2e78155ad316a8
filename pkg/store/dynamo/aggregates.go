package dynamo

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

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

// Fold is one TransactWriteItems: the marker of the generation, put if absent, and an ADD of the
// totals to the day × model and the month roll-up items (which ADD creates). A marker that
// exists cancels the transaction, and nothing changes. Every number is an exact integer.
func (s *Store) Fold(ctx context.Context, d usage.Delta) (bool, error) {
	if d.OrgID == "" || d.GenerationID == "" || d.Day == "" || d.Month == "" {
		return false, fmt.Errorf("fold %s of %s: incomplete delta", d.GenerationID, d.OrgID)
	}
	// Every attribute goes through a name placeholder: day and month are reserved words.
	add := func(sk string, set map[string]string) types.TransactWriteItem {
		names := map[string]string{"#org": "org_id"}
		values := item{":org": sv(d.OrgID)}
		expr := "SET #org = :org"
		for name, v := range set {
			expr += ", #" + name + " = :" + name
			names["#"+name], values[":"+name] = name, sv(v)
		}
		expr += " ADD"
		for i, f := range []struct {
			name string
			n    int64
		}{
			{"requests", d.Requests}, {"prompt_tokens", d.PromptTokens}, {"cached_tokens", d.CachedTokens},
			{"completion_tokens", d.CompletionTokens}, {"cost", int64(d.Cost)},
		} {
			if i > 0 {
				expr += ","
			}
			expr += " #" + f.name + " :" + f.name
			names["#"+f.name], values[":"+f.name] = f.name, nv(f.n)
		}
		return types.TransactWriteItem{Update: &types.Update{
			TableName:                 &s.tables.Aggregates,
			Key:                       keyOf("pk", d.OrgID, "sk", sk),
			UpdateExpression:          aws.String(expr),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
		}}
	}
	c, err := s.transact(ctx, func() []types.TransactWriteItem {
		return []types.TransactWriteItem{
			{Put: &types.Put{
				TableName: &s.tables.Aggregates,
				Item: item{
					"pk": sv(markerPrefix + d.GenerationID), "sk": sv(d.OrgID),
					"org_id": sv(d.OrgID), "generation_id": sv(d.GenerationID), "day": sv(d.Day),
					"cost": nv(int64(d.Cost)),
				},
				ConditionExpression: aws.String("attribute_not_exists(pk)"),
			}},
			add(dayPrefix+d.Day+"#"+d.Model, map[string]string{"day": d.Day, "model": d.Model}),
			add(monthPrefix+d.Month, map[string]string{"month": d.Month}),
		}
	})
	if err != nil {
		return false, fmt.Errorf("fold %s of %s: %w", d.GenerationID, d.OrgID, err)
	}
	if c == nil {
		return true, nil
	}
	if failed, _ := c.failed(0); failed {
		return false, nil
	}
	return false, fmt.Errorf("fold %s of %s: transaction cancelled: %v", d.GenerationID, d.OrgID, c)
}

// DailyRollups queries the organization's partition for the day items from..to.
func (s *Store) DailyRollups(ctx context.Context, orgID, fromDay, toDay string) ([]usage.Rollup, error) {
	// '$' sorts right after '#', so the upper bound covers every model of the last day.
	rs, err := s.rollups(ctx, orgID, dayPrefix+fromDay, dayPrefix+toDay+"$")
	if err != nil {
		return nil, fmt.Errorf("daily roll-ups of %s: %w", orgID, err)
	}
	return rs, nil
}

// MonthlyRollups queries the organization's partition for the month items from..to.
func (s *Store) MonthlyRollups(ctx context.Context, orgID, fromMonth, toMonth string) ([]usage.Rollup, error) {
	rs, err := s.rollups(ctx, orgID, monthPrefix+fromMonth, monthPrefix+toMonth)
	if err != nil {
		return nil, fmt.Errorf("monthly roll-ups of %s: %w", orgID, err)
	}
	return rs, nil
}

func (s *Store) rollups(ctx context.Context, orgID, from, to string) ([]usage.Rollup, error) {
	var query *dynamodb.QueryInput
	if from <= to {
		query = &dynamodb.QueryInput{
			TableName:                 &s.tables.Aggregates,
			KeyConditionExpression:    aws.String("pk = :org AND sk BETWEEN :from AND :to"),
			ExpressionAttributeValues: item{":org": sv(orgID), ":from": sv(from), ":to": sv(to)},
			ConsistentRead:            aws.Bool(true),
		}
	}
	return listOrg(ctx, s, orgID, query, func(it item) (usage.Rollup, error) {
		d := decoder{it: it}
		r := usage.Rollup{OrgID: orgID}
		if d.has("month") {
			r.Month = d.str("month")
		} else {
			r.Day, r.Model = d.str("day"), d.str("model")
		}
		r.Requests = d.num("requests")
		r.PromptTokens = d.num("prompt_tokens")
		r.CachedTokens = d.num("cached_tokens")
		r.CompletionTokens = d.num("completion_tokens")
		r.Cost = money.Amount(d.num("cost"))
		return r, d.err
	})
}

var _ store.Store = (*Store)(nil)
