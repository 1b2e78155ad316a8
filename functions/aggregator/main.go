// Command aggregator is the SQS consumer of usage events on AWS Lambda: EventBridge rule → SQS
// queue → this function, with ReportBatchItemFailures so that only failed messages come back
// (and reach the dead-letter queue after the queue's maxReceiveCount). It decodes and validates
// each event (pkg/ingest) and hands valid ones to the aggregation; until the usage pipeline's
// fold exists (issue 5) that is ingest.LogRecorder, which logs and accepts.
//
// The release build is linux/arm64 with -tags lambda.norpc and CGO_ENABLED=0 (infra/lambdabuild).
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/neocloud/kiln/pkg/ingest"
)

func main() {
	// Only the log level is read: pkg/config would link the embedded store into a function that
	// has no use for it yet.
	level := slog.LevelInfo
	if v := os.Getenv("KILN_LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			fmt.Fprintf(os.Stderr, "aggregator: configuration:\nKILN_LOG_LEVEL=%q: want debug, info, warn or error\n", v)
			os.Exit(2)
		}
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	h := ingest.New(ingest.LogRecorder{Log: log}, log)
	lambda.StartHandlerFunc(h.Handle)
}
