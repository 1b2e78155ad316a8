package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// sqsTarget is the pipe's target (pipe.Target) as on AWS: one SendMessageBatch per batch to the
// queue at queueURL. Entries the queue refuses are sent again (up to three tries in all), the
// others not. Only this suite sends to a queue: off AWS the gateway hands the pipe's batches to
// the aggregator's handler itself (functions/gateway/pipe.go).
type sqsTarget struct {
	client   *sqs.Client
	queueURL string
}

// Send implements pipe.Target.
func (q sqsTarget) Send(ctx context.Context, bodies []string) error {
	pending := make(map[string]string, len(bodies))
	for i, b := range bodies {
		pending[strconv.Itoa(i)] = b
	}
	var last []string
	for try := 0; try < 3 && len(pending) > 0; try++ {
		entries := make([]sqstypes.SendMessageBatchRequestEntry, 0, len(pending))
		for i := range bodies {
			id := strconv.Itoa(i)
			if b, ok := pending[id]; ok {
				entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(id), MessageBody: aws.String(b)})
			}
		}
		out, err := q.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &q.queueURL, Entries: entries})
		if err != nil {
			return fmt.Errorf("SendMessageBatch: %w", err)
		}
		for _, s := range out.Successful {
			delete(pending, aws.ToString(s.Id))
		}
		last = last[:0]
		for _, f := range out.Failed {
			last = append(last, aws.ToString(f.Code)+": "+aws.ToString(f.Message))
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("SendMessageBatch: %d of %d messages refused (%s)", len(pending), len(bodies), strings.Join(last, "; "))
	}
	return nil
}
