package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/oklog/ulid/v2"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/usage"
)

// emf is the reconciliation's metric line as CloudWatch reads it.
type emf struct {
	AWS struct {
		Timestamp         int64 `json:"Timestamp"`
		CloudWatchMetrics []struct {
			Namespace  string     `json:"Namespace"`
			Dimensions [][]string `json:"Dimensions"`
			Metrics    []struct {
				Name string `json:"Name"`
				Unit string `json:"Unit"`
			} `json:"Metrics"`
		} `json:"CloudWatchMetrics"`
	} `json:"_aws"`
	TablePrefix   string   `json:"TablePrefix"`
	Differences   *int     `json:"ReconciliationDifferences"`
	Requests      *int     `json:"ReconciledRequests"`
	Day           string   `json:"day"`
	LedgerUSD     string   `json:"ledger_usd"`
	GenerationIDs []string `json:"generation_ids"`
}

// TestScheduledReconciliationOfYesterday runs the daily reconciliation on DynamoDB Local tables
// that the store's own settlement and fold wrote, and reads the metric it writes: zero
// differences, then one naming the request whose debit was deleted.
func TestScheduledReconciliationOfYesterday(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := dynamotest.StartDynamoDBLocal(ctx)
	if err != nil {
		t.Fatalf("cannot start DynamoDB Local: %v", err)
	}
	t.Cleanup(srv.Stop)
	cfg := srv.Config()
	st := srv.OpenStore(t, cfg)

	now := time.Date(2026, 11, 30, 1, 30, 0, 0, time.UTC) // the schedule's hour
	day := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	for _, org := range []string{"org_a", "org_b"} {
		if err := st.CreateOrg(ctx, store.Org{ID: org, Name: org, Status: store.OrgActive, MaxInFlight: 8, CreatedAt: day.AddDate(0, 0, -3)}); err != nil {
			t.Fatal(err)
		}
		if err := st.AddEntry(ctx, store.LedgerEntry{ID: "top_" + org, OrgID: org, Kind: store.EntryTopUp, Amount: 10 * money.Dollar, At: day.AddDate(0, 0, -3)}); err != nil {
			t.Fatal(err)
		}
	}
	var gens []string
	settle := func(org string, started time.Time, took time.Duration, cost money.Amount, status usage.Status) string {
		gen := "gen-" + ulid.MustNew(ulid.Timestamp(started), rand.Reader).String()
		e := usage.Event{Version: usage.SchemaVersion, GenerationID: gen, OrgID: org, KeyID: "kiln-AbC123xY", Model: "gpt-oss-120b",
			Endpoint: "/v1/chat/completions", Status: status, HTTPStatus: 200, PromptTokens: 9, CompletionTokens: 12,
			Cost: cost, StartedAt: started, DurationMillis: took.Milliseconds(), Backend: "b"}
		if _, err := st.Settle(ctx, store.Settlement{Event: e, Now: started.Add(took)}); err != nil {
			t.Fatal(err)
		}
		if _, err := usage.NewAggregator(st).Fold(ctx, e); err != nil {
			t.Fatal(err)
		}
		gens = append(gens, gen)
		return gen
	}
	settle("org_a", day.Add(-time.Minute), 2*time.Minute, 7_000_000, usage.StatusCompleted) // the day before, debited on the day
	settle("org_a", day.Add(9*time.Hour), time.Second, 1_155_000, usage.StatusCompleted)
	victim := settle("org_a", day.Add(15*time.Hour), time.Second, 665_000, usage.StatusClientDisconnected)
	settle("org_a", day.Add(24*time.Hour-time.Second), 5*time.Second, 3_000_000, usage.StatusCompleted) // debited after midnight
	settle("org_b", day.Add(12*time.Hour), time.Second, 123_456_789_012, usage.StatusCompleted)
	settle("org_b", day.Add(13*time.Hour), 0, 0, usage.StatusRejected)
	settle("org_b", day.Add(30*time.Hour), time.Second, 5, usage.StatusCompleted) // today: not yet

	var stdout bytes.Buffer
	f := &function{
		ingest: usage.NewHandler(usage.NewAggregator(st), nil), tables: st, prefix: cfg.TablePrefix,
		stdout: &stdout, log: slog.New(slog.DiscardHandler), now: func() time.Time { return now },
	}
	invoke := func(payload string) (reconciliation, emf) {
		t.Helper()
		stdout.Reset()
		out, err := f.Invoke(ctx, json.RawMessage(payload))
		if err != nil {
			t.Fatalf("invoke %s: %v", payload, err)
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		if len(lines) != 1 {
			t.Fatalf("want one metric line on stdout, got %q", stdout.String())
		}
		var m emf
		if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
			t.Fatalf("metric line %q: %v", lines[0], err)
		}
		return out.(reconciliation), m
	}

	res, m := invoke(`{"task":"reconcile"}`)
	if !res.Agrees || res.Day != "2026-11-29" || res.Requests != 5 || res.Organizations != 2 || res.Differences != 0 {
		t.Errorf("reconciliation of yesterday: %+v", res)
	}
	cw := m.AWS.CloudWatchMetrics
	if len(cw) != 1 || cw[0].Namespace != "Kiln" || !slices.Equal(cw[0].Dimensions[0], []string{"TablePrefix"}) ||
		cw[0].Metrics[0].Name != "ReconciliationDifferences" || m.TablePrefix != cfg.TablePrefix ||
		m.Differences == nil || *m.Differences != 0 || *m.Requests != 5 || m.AWS.Timestamp != now.UnixMilli() ||
		m.LedgerUSD != "0.123461609012" {
		t.Errorf("metric line: %s", stdout.String())
	}

	// Delete one debit: the next run counts one difference and names its generation.
	if _, err := st.Client().DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(st.Tables().Ledger),
		Key:       map[string]types.AttributeValue{"org_id": &types.AttributeValueMemberS{Value: "org_a"}, "entry_id": &types.AttributeValueMemberS{Value: victim}},
	}); err != nil {
		t.Fatal(err)
	}
	res, m = invoke(`{"task":"reconcile","day":"2026-11-29"}`)
	if res.Agrees || res.Differences != 1 || !strings.Contains(res.FirstDifference, victim) || *m.Differences != 1 ||
		!slices.Equal(m.GenerationIDs, []string{victim}) {
		t.Errorf("after deleting the debit of %s: %+v\n%s", victim, res, stdout.String())
	}

	// A fold lost: one generation's marker gone and its cost taken off its roll-up. The roll-ups
	// then differ from the usage records, and the markers name the generation.
	lost := gens[4] // org_b's request of the day
	tables := st.Tables()
	if _, err := st.Client().DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(tables.Aggregates),
		Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "gen#" + lost}, "sk": &types.AttributeValueMemberS{Value: "org_b"}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(tables.Aggregates),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "org_b"}, "sk": &types.AttributeValueMemberS{Value: "day#2026-11-29#gpt-oss-120b"}},
		UpdateExpression:          aws.String("ADD #c :c, #r :r"),
		ExpressionAttributeNames:  map[string]string{"#c": "cost", "#r": "requests"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":c": &types.AttributeValueMemberN{Value: "-123456789012"}, ":r": &types.AttributeValueMemberN{Value: "-1"}},
	}); err != nil {
		t.Fatal(err)
	}
	res, m = invoke(`{"task":"reconcile"}`)
	if res.Differences != 2 || *m.Differences != 2 || !slices.Contains(m.GenerationIDs, lost) || !slices.Contains(m.GenerationIDs, victim) {
		t.Errorf("after losing the fold of %s: %+v\n%s", lost, res, stdout.String())
	}

	// Other invocations still reach the ingest handler; an unknown task is an error.
	if out, err := f.Invoke(ctx, json.RawMessage(`{"Records":[]}`)); err != nil || out == nil {
		t.Errorf("an SQS batch: %v, %v", out, err)
	}
	if _, err := f.Invoke(ctx, json.RawMessage(`{"task":"compact"}`)); err == nil {
		t.Error("an unknown task: no error")
	}
	if _, err := f.Invoke(ctx, json.RawMessage(`{"source":"aws.events","detail-type":"Scheduled Event"}`)); err == nil || !strings.Contains(err.Error(), "want an SQS batch") {
		t.Errorf("a misrouted EventBridge event: %v", err)
	}
}
