package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/usage"
	"github.com/neocloud/kiln/pkg/usage/pipe"
)

// pipePoll is how often the local stand-in for the EventBridge Pipe reads the usage stream; a
// pipe polls a DynamoDB stream's shards about four times a second.
const pipePoll = 250 * time.Millisecond

// startUsagePipe starts what carries settled usage events to the aggregates off Lambda, and
// returns how to stop it (after the gateway has settled everything: it reads the stream to its
// end first). The embedded store folds each event as it settles it, so there is nothing to
// start. On a local DynamoDB endpoint (DynamoDB Local, moto), which starts empty, it first creates
// the tables that do not exist yet, turning point-in-time recovery on where the server has it, as
// template.yaml does (in AWS the tables come from the template and are never created here); then
// the stand-in for the EventBridge Pipe reads the usage table's stream and hands each batch to the
// aggregator's own handler, as the pipe and the queue do on AWS. Against DynamoDB in AWS the
// stack's pipe does it. Human-readable start-up lines go to out.
func startUsagePipe(ctx context.Context, cfg config.Config, st store.Store, log *slog.Logger, out io.Writer) (stop func(), err error) {
	ds, ok := st.(*dynamo.Store)
	if !ok || cfg.DynamoDBEndpoint == "" {
		how := "folded into the aggregates as they are settled"
		if ok {
			how = "carried by the stack's EventBridge Pipe from the usage table's stream"
		}
		log.Info("usage events", slog.String("aggregated", how))
		return func() {}, nil
	}
	created, _, err := ds.SetUpLocal(ctx)
	if err != nil {
		return nil, fmt.Errorf("on %s: %w", cfg.DynamoDBEndpoint, err)
	}
	if len(created) > 0 {
		fmt.Fprintf(out, "Created DynamoDB tables on %s: %s\n", cfg.DynamoDBEndpoint, strings.Join(created, ", "))
	}
	log.Info("dynamodb tables ready", slog.String("endpoint", cfg.DynamoDBEndpoint),
		slog.String("orgs", ds.Tables().Orgs), slog.Int("created", len(created)))
	arn, err := pipe.StreamOf(ctx, ds.Client(), ds.Tables().Usage)
	if err != nil {
		return nil, fmt.Errorf("usage pipeline: %w", err)
	}
	p := pipe.New(ds.Client(), arn, handlerTarget{usage.NewHandler(usage.NewAggregator(ds), log)}, log)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(runCtx, pipePoll)
	}()
	log.Info("usage events", slog.String("aggregated", "read from the usage table's stream by the local pipe"), slog.String("stream", arn))
	return func() {
		cancel()
		<-done
		drain, cancelDrain := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancelDrain()
		if _, err := p.Poll(drain); err != nil {
			log.Warn("usage stream not read to its end at shutdown; the next start reads it again", slog.String("error", err.Error()))
		}
	}, nil
}

// handlerTarget hands each batch to the aggregator's handler as the SQS event source mapping
// would. A batch with failures is refused whole, so that the pipe delivers it again on its next
// poll (the fold is idempotent): locally nothing is dropped, where on AWS the queue would move a
// message that keeps failing to its dead-letter queue.
type handlerTarget struct{ h *usage.Handler }

func (t handlerTarget) Send(ctx context.Context, bodies []string) error {
	batch := events.SQSEvent{Records: make([]events.SQSMessage, len(bodies))}
	for i, b := range bodies {
		batch.Records[i] = events.SQSMessage{MessageId: strconv.Itoa(i), Body: b, EventSource: "aws:sqs"}
	}
	resp, err := t.h.Handle(ctx, batch)
	if err != nil {
		return err
	}
	if n := len(resp.BatchItemFailures); n > 0 {
		return fmt.Errorf("the aggregator failed %d of %d usage records", n, len(bodies))
	}
	return nil
}
