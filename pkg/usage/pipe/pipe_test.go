package pipe_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/pkg/usage/pipe"
)

var update = flag.Bool("update", false, "rewrite events/sqs-pipe-usage-batch.json from records read off DynamoDB Local")

var ddb *dynamotest.Server

func TestMain(m *testing.M) {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var err error
	ddb, err = dynamotest.StartDynamoDBLocal(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start DynamoDB Local: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	ddb.Stop()
	os.Exit(code)
}

// capture is a target that keeps every batch, and refuses the first refuse batches.
type capture struct {
	mu      sync.Mutex
	refuse  int
	batches [][]string
	refused [][]string
}

func (c *capture) Send(_ context.Context, bodies []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refuse > 0 {
		c.refuse--
		c.refused = append(c.refused, slices.Clone(bodies))
		return errors.New("target unavailable (injected)")
	}
	c.batches = append(c.batches, slices.Clone(bodies))
	return nil
}

func (c *capture) bodies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Concat(c.batches...)
}

func newOrg(t *testing.T, st *dynamo.Store, id string) {
	t.Helper()
	now := time.Now().UTC()
	if err := st.CreateOrg(t.Context(), store.Org{ID: id, Name: id, Status: store.OrgActive, MaxInFlight: 8, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddEntry(t.Context(), store.LedgerEntry{ID: "top", OrgID: id, Kind: store.EntryTopUp, Amount: money.Amount(10_000_000_000_000), At: now}); err != nil {
		t.Fatal(err)
	}
}

func event(i int, started time.Time) usage.Event {
	e := usage.Event{
		Version: usage.SchemaVersion, GenerationID: fmt.Sprintf("gen-01JDZ8K3W6Q2V7N4R5T8Y9B%03d", i), OrgID: "org_acme", KeyID: "kiln-AbC123xY",
		Model: "gpt-oss-120b", Endpoint: "/v1/chat/completions", Stream: true, Status: usage.StatusCompleted, HTTPStatus: 200,
		FinishReason: "stop", PromptTokens: 9, CompletionTokens: 12, Cost: money.Amount(1_155_000), StartedAt: started,
		TTFTMillis: 84, DurationMillis: 412, Backend: "gpt-oss-120b-a",
	}
	if i%3 == 1 {
		e.Endpoint, e.Stream, e.Status, e.HTTPStatus, e.FinishReason = "/v1/completions", false, usage.StatusClientDisconnected, 499, ""
		e.PromptTokens, e.CompletionTokens, e.Cost, e.Estimated = 5, 7, money.Amount(665_000), true
	}
	if i%3 == 2 {
		e.Status, e.HTTPStatus, e.CompletionTokens, e.Cost, e.FinishReason, e.PromptTokens = usage.StatusRejected, 400, 0, 0, "", 0
	}
	return e
}

// TestPipeCarriesSettledUsage settles usage events through the real store on DynamoDB Local and
// reads its usage stream through the pipe: every settled event arrives once, in order, as a
// message the aggregator decodes to the same event; the items of running requests and REMOVE
// records are filtered out; a batch the target refuses is delivered again, not lost.
func TestPipeCarriesSettledUsage(t *testing.T) {
	st := ddb.NewStore(t)
	newOrg(t, st, "org_acme")
	arn, err := pipe.StreamOf(t.Context(), st.Client(), st.Tables().Usage)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Date(2026, 11, 29, 17, 20, 0, 123_000_000, time.UTC)
	var want []usage.Event
	for i := range 23 {
		e := event(i, started.Add(time.Duration(i)*time.Millisecond))
		if _, err := st.Settle(t.Context(), store.Settlement{Event: e, Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
		want = append(want, e)
	}
	// A running request's item (the status the store writes while a request is in flight), and
	// a deleted item: neither is a final usage record.
	running := map[string]ddbtypes.AttributeValue{
		"org_id":        &ddbtypes.AttributeValueMemberS{Value: "org_acme"},
		"generation_id": &ddbtypes.AttributeValueMemberS{Value: "gen-RUNNING"},
		"status":        &ddbtypes.AttributeValueMemberS{Value: string(usage.StatusInProgress)},
	}
	if _, err := st.Client().PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(st.Tables().Usage), Item: running}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().DeleteItem(t.Context(), &dynamodb.DeleteItemInput{TableName: aws.String(st.Tables().Usage),
		Key: map[string]ddbtypes.AttributeValue{"org_id": running["org_id"], "generation_id": running["generation_id"]}}); err != nil {
		t.Fatal(err)
	}

	target := &capture{refuse: 1}
	p := pipe.New(st.Client(), arn, target, nil)
	if _, err := p.Poll(t.Context()); err == nil {
		t.Fatal("the first poll's target refused its batch: want the error")
	}
	for deadline := time.Now().Add(30 * time.Second); len(target.bodies()) < len(want); {
		if _, err := p.Poll(t.Context()); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records delivered in 30 s", len(target.bodies()), len(want))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, err := p.Poll(t.Context()); err != nil || n != 0 {
		t.Errorf("a poll after everything was delivered delivered %d (%v), want 0", n, err)
	}
	if len(target.refused) != 1 || !slices.Equal(target.refused[0], target.batches[0]) {
		t.Errorf("the refused batch was not delivered again first: refused %d batches", len(target.refused))
	}
	for _, b := range target.batches {
		if len(b) > pipe.BatchSize {
			t.Errorf("a batch of %d records: a pipe sends at most %d to SQS", len(b), pipe.BatchSize)
		}
	}
	var got []usage.Event
	for _, body := range target.bodies() {
		var rec events.DynamoDBEventRecord
		if err := json.Unmarshal([]byte(body), &rec); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		if rec.EventSource != "aws:dynamodb" || rec.EventName != "INSERT" || rec.EventSourceArn != arn || rec.Change.StreamViewType != "NEW_IMAGE" ||
			rec.Change.SequenceNumber == "" || rec.Change.Keys["generation_id"].String() == "" {
			t.Errorf("record %s: want an INSERT of the usage stream with its keys, sequence number and new image", body)
		}
		e, err := usage.Decode([]byte(body))
		if err != nil {
			t.Fatalf("the aggregator cannot decode %s: %v", body, err)
		}
		got = append(got, e)
	}
	if !slices.Equal(got, want) {
		t.Errorf("delivered events differ from the settled ones:\n got %+v\nwant %+v", got, want)
	}
	if *update {
		writeSample(t, target.bodies()[:2], arn, st.Tables().Usage)
	}
}

// TestKeep is the pipe's filter, record by record, against what template.yaml's FilterCriteria say.
func TestKeep(t *testing.T) {
	img := func(status string) map[string]events.DynamoDBAttributeValue {
		return map[string]events.DynamoDBAttributeValue{"status": events.NewStringAttribute(status)}
	}
	for _, tc := range []struct {
		name string
		r    events.DynamoDBEventRecord
		keep bool
	}{
		{"insert completed", events.DynamoDBEventRecord{EventName: "INSERT", Change: events.DynamoDBStreamRecord{NewImage: img("completed")}}, true},
		{"modify to completed", events.DynamoDBEventRecord{EventName: "MODIFY", Change: events.DynamoDBStreamRecord{NewImage: img("deadline_exceeded")}}, true},
		{"insert in progress", events.DynamoDBEventRecord{EventName: "INSERT", Change: events.DynamoDBStreamRecord{NewImage: img("in_progress")}}, false},
		{"modify in progress", events.DynamoDBEventRecord{EventName: "MODIFY", Change: events.DynamoDBStreamRecord{NewImage: img("in_progress")}}, false},
		{"remove", events.DynamoDBEventRecord{EventName: "REMOVE"}, false},
		{"no status", events.DynamoDBEventRecord{EventName: "INSERT", Change: events.DynamoDBStreamRecord{NewImage: map[string]events.DynamoDBAttributeValue{}}}, false},
		{"status not a string", events.DynamoDBEventRecord{EventName: "INSERT", Change: events.DynamoDBStreamRecord{NewImage: map[string]events.DynamoDBAttributeValue{"status": events.NewNumberAttribute("1")}}}, false},
	} {
		if got := pipe.Keep(tc.r); got != tc.keep {
			t.Errorf("%s: kept %v, want %v", tc.name, got, tc.keep)
		}
	}
}

// writeSample writes the recorded sample of what the pipe puts on the queue: the first two
// records as DynamoDB Local wrote them (ARNs and region as on AWS), and records the aggregator
// must refuse or skip.
func writeSample(t *testing.T, bodies []string, arn, table string) {
	t.Helper()
	const awsARN = "arn:aws:dynamodb:us-east-1:123456789012:table/kiln-usage/stream/2026-11-29T17:00:00.000"
	fix := func(b string) string {
		b = strings.ReplaceAll(b, arn, awsARN)
		b = regexp.MustCompile(`"awsRegion":"[^"]*"`).ReplaceAllString(b, `"awsRegion":"us-east-1"`)
		return strings.ReplaceAll(b, table, "kiln-usage")
	}
	var rec events.DynamoDBEventRecord
	if err := json.Unmarshal([]byte(bodies[0]), &rec); err != nil {
		t.Fatal(err)
	}
	modify := func(mod func(img map[string]events.DynamoDBAttributeValue)) string {
		r := rec
		r.EventName, r.EventID = "MODIFY", "sample-modify"
		r.Change.NewImage = map[string]events.DynamoDBAttributeValue{}
		for k, v := range rec.Change.NewImage {
			r.Change.NewImage[k] = v
		}
		mod(r.Change.NewImage)
		b, _ := json.Marshal(r)
		return fix(string(b))
	}
	msgs := []string{
		fix(bodies[0]),
		fix(bodies[1]),
		modify(func(img map[string]events.DynamoDBAttributeValue) {
			img["status"] = events.NewStringAttribute(string(usage.StatusInProgress))
		}),
		modify(func(img map[string]events.DynamoDBAttributeValue) {
			delete(img, "cost")
			img["generation_id"] = events.NewStringAttribute("gen-01JDZ8K3W6Q2V7N4R5T8Y9BNOC")
		}),
		`{"eventSource":"aws:dynamodb","dynamodb":{"NewImage": truncated`,
	}
	batch := events.SQSEvent{}
	for i, m := range msgs {
		batch.Records = append(batch.Records, events.SQSMessage{
			MessageId:     fmt.Sprintf("4a1e7c2d-000%d-4b8e-9f3a-00000000000%d", i+1, i+1),
			ReceiptHandle: fmt.Sprintf("AQEB4a1e7c2d000%d4b8e9f3a00000000000%d==", i+1, i+1),
			Body:          m,
			Attributes: map[string]string{"ApproximateReceiveCount": "1", "SentTimestamp": "1795972801000",
				"SenderId": "AROAEXAMPLE:pipes", "ApproximateFirstReceiveTimestamp": "1795972801050"},
			MessageAttributes: map[string]events.SQSMessageAttribute{},
			EventSource:       "aws:sqs",
			EventSourceARN:    "arn:aws:sqs:us-east-1:123456789012:kiln-UsageQueue-AbCdEf123456",
			AWSRegion:         "us-east-1",
		})
	}
	out, err := json.MarshalIndent(batch, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "..", "events", "sqs-pipe-usage-batch.json")
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}
