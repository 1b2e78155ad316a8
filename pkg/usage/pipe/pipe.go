// Package pipe stands in, locally and in tests, for the EventBridge Pipe that carries the usage
// table's DynamoDB stream to the aggregator's SQS queue on AWS (template.yaml, UsagePipe). It
// reads a stream through the DynamoDB Streams API (DynamoDB Local implements it), keeps the
// records the pipe's filter keeps (Keep), and hands them on in stream order, in batches of at
// most ten, to a Target: each record becomes one message whose body is the record as JSON — what
// a pipe without an input template sends to SQS. Like the pipe, it holds a shard's position until
// its target took the batch, so a failing target delays records and never drops them; and, like
// the pipe and the SQS queue behind it, it delivers at least once.
package pipe

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams/types"

	"github.com/neocloud/kiln/pkg/usage"
)

// BatchSize is the pipe's source batch size: ten, the most an SQS target takes in one
// SendMessageBatch.
const BatchSize = 10

// FilterPattern is the pipe's filter as template.yaml gives it to EventBridge (UsagePipe
// FilterCriteria); Keep applies it here.
const FilterPattern = `{"eventName":["INSERT","MODIFY"],"dynamodb":{"NewImage":{"status":{"S":[{"anything-but":["in_progress"]}]}}}}`

// Keep is FilterPattern: INSERT and MODIFY records whose new image has a string status other than
// in progress. REMOVE records, and the items of running requests, carry nothing to aggregate.
func Keep(r events.DynamoDBEventRecord) bool {
	if r.EventName != "INSERT" && r.EventName != "MODIFY" {
		return false
	}
	s, ok := r.Change.NewImage["status"]
	return ok && s.DataType() == events.DataTypeString && s.String() != string(usage.StatusInProgress)
}

// Target takes one batch of message bodies, in stream order. An error means the batch (or the
// part of it that the error names) must be delivered again.
type Target interface {
	Send(ctx context.Context, bodies []string) error
}

// Pipe reads one stream and feeds one target.
type Pipe struct {
	streams   *dynamodbstreams.Client
	streamARN string
	region    string
	target    Target
	log       *slog.Logger

	mu     sync.Mutex // one Poll at a time
	shards map[string]*shard
}

type shard struct {
	iterator *string
	last     string // sequence number of the last record handed on (or filtered out)
	done     bool   // closed and read to its end
}

// StreamOf returns the ARN of a table's latest stream, with a clear error when the table has
// none (kilnctl dev create-tables turns it on locally; template.yaml on AWS).
func StreamOf(ctx context.Context, db *dynamodb.Client, table string) (string, error) {
	out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table})
	if err != nil {
		return "", fmt.Errorf("describe table %s: %w", table, err)
	}
	spec := out.Table.StreamSpecification
	if out.Table.LatestStreamArn == nil || spec == nil || !aws.ToBool(spec.StreamEnabled) {
		return "", fmt.Errorf("table %s has no stream enabled: the usage pipeline reads its DynamoDB stream (StreamViewType NEW_IMAGE)", table)
	}
	return *out.Table.LatestStreamArn, nil
}

// New returns a pipe from the stream streamARN, read with a DynamoDB Streams client made from
// db's own configuration (endpoint, region, credentials), to target. A nil log discards. The
// client has connections of its own: a pipe is another service, and its polling must not change
// what the store's client finds in its pool.
func New(db *dynamodb.Client, streamARN string, target Target, log *slog.Logger) *Pipe {
	o := db.Options()
	client := dynamodbstreams.New(dynamodbstreams.Options{
		Region:       o.Region,
		Credentials:  o.Credentials,
		BaseEndpoint: o.BaseEndpoint,
		HTTPClient:   awshttp.NewBuildableClient(),
		Retryer:      o.Retryer,
	})
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Pipe{streams: client, streamARN: streamARN, region: o.Region, target: target, log: log, shards: map[string]*shard{}}
}

// Run polls the stream every interval until ctx ends. Errors are logged and retried: the records
// stay in the stream (24 hours) until they are delivered.
func (p *Pipe) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := p.Poll(ctx); err != nil && ctx.Err() == nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "usage stream: poll failed, retrying", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll reads every shard up to its current end and delivers what the filter keeps. It returns the
// number of records delivered. A shard is read only after its parent is read to its end, so that
// an item's records come in the order they were written.
func (p *Pipe) Poll(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	shards, err := p.describe(ctx)
	if err != nil {
		return 0, err
	}
	delivered := 0
	for progress := true; progress; {
		progress = false
		for _, s := range shards {
			id := aws.ToString(s.ShardId)
			st := p.shards[id]
			if st == nil {
				st = &shard{}
				p.shards[id] = st
			}
			if st.done {
				continue
			}
			if parent := p.shards[aws.ToString(s.ParentShardId)]; parent != nil && !parent.done {
				continue // read after its parent
			}
			n, err := p.read(ctx, id, st)
			delivered += n
			if err != nil {
				return delivered, err
			}
			if st.done {
				progress = true // its children may be read now
			}
		}
	}
	return delivered, nil
}

func (p *Pipe) describe(ctx context.Context) ([]types.Shard, error) {
	var shards []types.Shard
	var start *string
	for {
		out, err := p.streams.DescribeStream(ctx, &dynamodbstreams.DescribeStreamInput{StreamArn: &p.streamARN, ExclusiveStartShardId: start})
		if err != nil {
			return nil, fmt.Errorf("describe stream %s: %w", p.streamARN, err)
		}
		shards = append(shards, out.StreamDescription.Shards...)
		start = out.StreamDescription.LastEvaluatedShardId
		if start == nil {
			return shards, nil
		}
	}
}

// read reads one shard until it has no more records for now, or is closed.
func (p *Pipe) read(ctx context.Context, id string, st *shard) (int, error) {
	delivered, renewed := 0, false
	for {
		if st.iterator == nil {
			in := &dynamodbstreams.GetShardIteratorInput{StreamArn: &p.streamARN, ShardId: &id, ShardIteratorType: types.ShardIteratorTypeTrimHorizon}
			if st.last != "" {
				in.ShardIteratorType, in.SequenceNumber = types.ShardIteratorTypeAfterSequenceNumber, aws.String(st.last)
			}
			out, err := p.streams.GetShardIterator(ctx, in)
			if _, gone := errors.AsType[*types.ResourceNotFoundException](err); gone {
				st.done = true // trimmed away: nothing left to read
				return delivered, nil
			}
			if err != nil {
				return delivered, fmt.Errorf("shard %s: iterator: %w", id, err)
			}
			st.iterator = out.ShardIterator
		}
		out, err := p.streams.GetRecords(ctx, &dynamodbstreams.GetRecordsInput{ShardIterator: st.iterator, Limit: aws.Int32(1000)})
		var expired *types.ExpiredIteratorException
		var trimmed *types.TrimmedDataAccessException
		// An iterator expires after 15 minutes; and DynamoDB Local calls a TRIM_HORIZON iterator
		// taken on a shard that was still empty trimmed once records arrive. A fresh iterator
		// from the same position reads on.
		if (errors.As(err, &expired) || errors.As(err, &trimmed)) && !renewed {
			st.iterator, renewed = nil, true
			continue
		}
		if err != nil {
			return delivered, fmt.Errorf("shard %s: records: %w", id, err)
		}
		var kept []string
		for _, r := range out.Records {
			rec := p.record(r)
			if !Keep(rec) {
				continue
			}
			body, err := json.Marshal(rec)
			if err != nil {
				return delivered, fmt.Errorf("shard %s: record %s: %w", id, rec.EventID, err)
			}
			kept = append(kept, string(body))
		}
		for len(kept) > 0 {
			n := min(BatchSize, len(kept))
			if err := p.target.Send(ctx, kept[:n]); err != nil {
				// The iterator is not advanced: the next poll reads these records again, as a
				// pipe retries a batch its target refused.
				st.iterator = nil
				return delivered, fmt.Errorf("shard %s: deliver %d records: %w", id, n, err)
			}
			delivered += n
			kept = kept[n:]
		}
		if len(out.Records) > 0 {
			st.last = aws.ToString(out.Records[len(out.Records)-1].Dynamodb.SequenceNumber)
			renewed = false
		}
		st.iterator = out.NextShardIterator
		if st.iterator == nil {
			st.done = true
			return delivered, nil
		}
		if len(out.Records) == 0 {
			return delivered, nil
		}
	}
}

// record is a stream record as Lambda and EventBridge Pipes write it: the Streams API's record
// with the image in DynamoDB JSON and eventSourceARN the stream's ARN. Its userIdentity, which
// only TTL deletions carry, is left out: Keep drops every REMOVE.
func (p *Pipe) record(r types.Record) events.DynamoDBEventRecord {
	rec := events.DynamoDBEventRecord{
		AWSRegion:      cmp.Or(aws.ToString(r.AwsRegion), p.region),
		EventID:        aws.ToString(r.EventID),
		EventName:      string(r.EventName),
		EventSource:    cmp.Or(aws.ToString(r.EventSource), usage.StreamEventSource),
		EventVersion:   aws.ToString(r.EventVersion),
		EventSourceArn: p.streamARN,
	}
	if d := r.Dynamodb; d != nil {
		rec.Change = events.DynamoDBStreamRecord{
			Keys:           image(d.Keys),
			NewImage:       image(d.NewImage),
			OldImage:       image(d.OldImage),
			SequenceNumber: aws.ToString(d.SequenceNumber),
			SizeBytes:      aws.ToInt64(d.SizeBytes),
			StreamViewType: string(d.StreamViewType),
		}
		if d.ApproximateCreationDateTime != nil {
			rec.Change.ApproximateCreationDateTime = events.SecondsEpochTime{Time: *d.ApproximateCreationDateTime}
		}
	}
	return rec
}

func image(m map[string]types.AttributeValue) map[string]events.DynamoDBAttributeValue {
	if m == nil {
		return nil
	}
	out := make(map[string]events.DynamoDBAttributeValue, len(m))
	for k, v := range m {
		out[k] = value(v)
	}
	return out
}

func value(v types.AttributeValue) events.DynamoDBAttributeValue {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return events.NewStringAttribute(v.Value)
	case *types.AttributeValueMemberN:
		return events.NewNumberAttribute(v.Value)
	case *types.AttributeValueMemberBOOL:
		return events.NewBooleanAttribute(v.Value)
	case *types.AttributeValueMemberB:
		return events.NewBinaryAttribute(v.Value)
	case *types.AttributeValueMemberSS:
		return events.NewStringSetAttribute(v.Value)
	case *types.AttributeValueMemberNS:
		return events.NewNumberSetAttribute(v.Value)
	case *types.AttributeValueMemberBS:
		return events.NewBinarySetAttribute(v.Value)
	case *types.AttributeValueMemberM:
		return events.NewMapAttribute(image(v.Value))
	case *types.AttributeValueMemberL:
		l := make([]events.DynamoDBAttributeValue, len(v.Value))
		for i, x := range v.Value {
			l[i] = value(x)
		}
		return events.NewListAttribute(l)
	}
	return events.NewNullAttribute()
}
