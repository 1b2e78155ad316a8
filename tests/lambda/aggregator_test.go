package lambda

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/usage"
)

// TestAggregatorPartialBatch invokes the built aggregator with SQS batches of usage records and
// checks that exactly the undecodable and invalid messages come back as batch item failures, and
// that the valid ones are folded into the aggregates table once, however often they come: the
// pipe's messages (DynamoDB stream records of the usage table, events/sqs-pipe-usage-batch.json,
// among them a running request's record, acknowledged and not folded) and the EventBridge
// envelopes queued before the pipe replaced the bus (events/sqs-usage-batch.json).
func TestAggregatorPartialBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ddb, err := dynamotest.StartDynamoDBLocal(ctx)
	if err != nil {
		t.Fatalf("cannot start DynamoDB Local: %v", err)
	}
	t.Cleanup(ddb.Stop)
	for _, sample := range []struct {
		file   string
		failed []string
	}{
		{"sqs-pipe-usage-batch.json", []string{"4a1e7c2d-0004-4b8e-9f3a-000000000004", "4a1e7c2d-0005-4b8e-9f3a-000000000005"}},
		{"sqs-usage-batch.json", []string{"9d6c1a2e-0003-4f3b-8a7c-000000000003", "9d6c1a2e-0004-4f3b-8a7c-000000000004"}},
	} {
		t.Run(sample.file, func(t *testing.T) { aggregatorPartialBatch(t, ctx, ddb, sample.file, sample.failed) })
	}
}

func aggregatorPartialBatch(t *testing.T, ctx context.Context, ddb *dynamotest.Server, file string, failed []string) {
	cfg := ddb.Config()
	st := ddb.OpenStore(t, cfg)
	fn := startFunction(t, "aggregator", "KILN_LOG_LEVEL=info",
		"KILN_DYNAMODB_ENDPOINT="+ddb.Endpoint, "KILN_TABLE_PREFIX="+cfg.TablePrefix)
	sample, err := os.ReadFile(filepath.Join(repoRoot, "events", file))
	if err != nil {
		t.Fatal(err)
	}
	var batch events.SQSEvent
	if err := json.Unmarshal(sample, &batch); err != nil {
		t.Fatal(err)
	}
	valid := events.SQSEvent{Records: batch.Records[:2]}
	validJSON, _ := json.Marshal(valid)

	for _, tc := range []struct {
		name    string
		payload []byte
		failed  []string
	}{
		{"sample batch", sample, failed},
		{"all valid", validJSON, []string{}},
		{"empty batch", []byte(`{"Records":[]}`), []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := fn.invoke(t, tc.payload, longDeadline)
			if inv.outcome != "response" {
				t.Fatalf("invocation ended with %s %s: %s", inv.outcome, inv.errorType, inv.errorBody)
			}
			var resp struct {
				BatchItemFailures *[]events.SQSBatchItemFailure `json:"batchItemFailures"`
			}
			if err := json.Unmarshal(inv.body, &resp); err != nil || resp.BatchItemFailures == nil {
				t.Fatalf("response %q: want {\"batchItemFailures\": [...]} (%v)", inv.body, err)
			}
			got := []string{}
			for _, f := range *resp.BatchItemFailures {
				got = append(got, f.ItemIdentifier)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.failed) {
				t.Errorf("failed ids %v, want %v", got, tc.failed)
			}
		})
	}

	// The two valid events, folded once although they came twice.
	rollups, err := st.DailyRollups(ctx, "org_acme", "2026-11-29", "2026-11-29")
	if err != nil {
		t.Fatal(err)
	}
	want := []usage.Rollup{{OrgID: "org_acme", Day: "2026-11-29", Model: "gpt-oss-120b", Totals: usage.Totals{
		Requests: 2, PromptTokens: 14, CompletionTokens: 19, Cost: money.Amount(1_820_000)}}}
	if !reflect.DeepEqual(rollups, want) {
		t.Errorf("aggregates %+v, want %+v", rollups, want)
	}
}
