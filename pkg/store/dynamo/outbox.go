package dynamo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// UsageUnpublishedIndex is the usage table's sparse global secondary index of the events the bus
// has not acknowledged yet: partition unpublished (a shard, "u#00".."u#15"), sort settled_at.
// Settle writes the attribute; MarkPublished removes it, which takes the item out of the index.
const UsageUnpublishedIndex = "unpublished"

// outboxShards spreads the index's writes over several partition keys: one key for every
// settlement of every organization would be one hot partition of the index (about 1,000 writes
// a second), throttling the base table's settlements with it.
const outboxShards = 16

func outboxShard(generationID string) string {
	h := fnv.New32a()
	h.Write([]byte(generationID))
	return fmt.Sprintf("u#%02d", h.Sum32()%outboxShards)
}

// Unpublished lists up to limit events settled before before and not yet acknowledged, oldest
// settlement first: one query per shard of the sparse index (eventually consistent, so an event
// settled a moment ago may be missing; the sweep only asks for older ones).
func (s *Store) Unpublished(ctx context.Context, before time.Time, limit int) ([]usage.Event, error) {
	b, err := store.UnixNanos("before", before)
	if err != nil {
		return nil, fmt.Errorf("unpublished events: %w", err)
	}
	if limit <= 0 {
		return nil, nil
	}
	type found struct {
		settled int64
		e       usage.Event
	}
	shards := make([][]found, outboxShards)
	err = parallel(outboxShards, func(i int) error {
		out, err := s.db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &s.tables.Usage,
			IndexName:                 aws.String(UsageUnpublishedIndex),
			KeyConditionExpression:    aws.String("unpublished = :shard AND settled_at < :before"),
			ExpressionAttributeValues: item{":shard": sv(fmt.Sprintf("u#%02d", i)), ":before": nv(b)},
			Limit:                     aws.Int32(int32(min(limit, 1000))),
		})
		if err != nil {
			return err
		}
		for _, it := range out.Items {
			e, err := decodeEvent(it)
			if err != nil {
				return err
			}
			d := decoder{it: it}
			shards[i] = append(shards[i], found{d.num("settled_at"), e})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("unpublished events: %w", err)
	}
	all := slices.Concat(shards...)
	slices.SortFunc(all, func(a, b found) int {
		return cmp.Or(cmp.Compare(a.settled, b.settled), cmp.Compare(a.e.OrgID, b.e.OrgID),
			cmp.Compare(a.e.GenerationID, b.e.GenerationID))
	})
	events := make([]usage.Event, 0, min(limit, len(all)))
	for _, f := range all[:min(limit, len(all))] {
		events = append(events, f.e)
	}
	return events, nil
}

// MarkPublished removes the unpublished attribute of each event, one UpdateItem each (on the
// condition that the item exists, so that an unknown ref creates nothing).
func (s *Store) MarkPublished(ctx context.Context, refs []store.EventRef) error {
	err := parallel(len(refs), func(i int) error {
		r := refs[i]
		err := write(ctx, func() error {
			_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:           &s.tables.Usage,
				Key:                 keyOf("org_id", r.OrgID, "generation_id", r.GenerationID),
				UpdateExpression:    aws.String("REMOVE unpublished"),
				ConditionExpression: aws.String("attribute_exists(generation_id)"),
			})
			return err
		})
		if failed, _ := conditionFailed(err); failed {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s of %s: %w", r.GenerationID, r.OrgID, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark events published: %w", err)
	}
	return nil
}

// parallel runs fn(0..n-1), four at a time, and returns every error joined.
func parallel(n int, fn func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 4)
	)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
