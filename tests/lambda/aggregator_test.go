package lambda

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// TestAggregatorPartialBatch invokes the built aggregator with SQS batches of usage events and
// checks that exactly the undecodable and invalid messages come back as batch item failures.
func TestAggregatorPartialBatch(t *testing.T) {
	fn := startFunction(t, "aggregator", "KILN_LOG_LEVEL=info")
	sample, err := os.ReadFile(filepath.Join(repoRoot, "events", "sqs-usage-batch.json"))
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
		{"sample batch", sample, []string{"9d6c1a2e-0003-4f3b-8a7c-000000000003", "9d6c1a2e-0004-4f3b-8a7c-000000000004"}},
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
}
