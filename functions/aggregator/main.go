// Command aggregator is the usage pipeline's consumer on AWS Lambda: the usage table's DynamoDB
// stream → EventBridge Pipe → SQS queue → this function, with ReportBatchItemFailures so that only
// failed messages come back (and reach the dead-letter queue after the queue's maxReceiveCount).
// It decodes and validates each usage record (usage.Handler) and folds it into the aggregates table
// (usage.Aggregator, idempotent by generation id).
//
// Once a day (the Reconcile schedule, input {"task": "reconcile"}) it reconciles yesterday from
// the tables themselves — the ledger's debits against the usage records against the day
// roll-ups, per organization (pkg/finance) — and writes the result as a CloudWatch metric in the
// embedded metric format on stdout (Kiln/ReconciliationDifferences), which an alarm watches.
//
// The release build is linux/arm64 with -tags lambda.norpc and CGO_ENABLED=0 (infra/lambdabuild).
package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/neocloud/kiln/pkg/awsenv"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/usage"
)

func main() {
	h, err := setup(context.Background(), os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "aggregator: %v\n", err)
		os.Exit(2)
	}
	lambda.StartHandlerFunc(h.Invoke)
}

// setup wires the function from its environment. It reads only the four settings it has —
// pkg/config is the gateway's and kilnctl's, and checks settings this function does not take.
func setup(ctx context.Context, getenv func(string) string) (*function, error) {
	level := slog.LevelInfo
	if v := getenv("KILN_LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			return nil, fmt.Errorf("configuration:\nKILN_LOG_LEVEL=%q: want debug, info, warn or error", v)
		}
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	prefix := cmp.Or(getenv("KILN_TABLE_PREFIX"), dynamo.DefaultTablePrefix) // the metric's dimension too
	st, err := dynamo.Open(ctx, dynamo.Config{
		TablePrefix: prefix,
		Endpoint:    awsenv.Endpoint(getenv, "KILN_DYNAMODB_ENDPOINT", awsenv.DynamoDB),
		Region:      getenv("AWS_REGION"),
	})
	if err != nil {
		return nil, err
	}
	h := usage.NewHandler(usage.NewAggregator(st), log)
	return &function{ingest: h, tables: st, prefix: prefix, stdout: os.Stdout, log: log, now: time.Now}, nil
}
