package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/neocloud/kiln/pkg/usage"
)

// awsConfig is the SDK configuration for the local servers: fixed credentials, one region.
func awsConfig() aws.Config {
	return aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("kilnlocal", "kilnlocal", ""),
	}
}

// pipeline is the AWS side of the usage pipeline on moto: the aggregator's queue and its
// dead-letter queue, which the EventBridge Pipe fills on AWS (here pkg/usage/pipe, the pipe's
// stand-in, reading DynamoDB Local's stream of the usage table).
type pipeline struct {
	sqs      *sqs.Client
	queueURL string
	dlqURL   string
}

// maxReceiveCount is the usage queue's redrive threshold: a message received this many times
// without being deleted goes to the dead-letter queue on its next receive.
const maxReceiveCount = 2

func newPipeline(t *testing.T, endpoint, name string) *pipeline {
	t.Helper()
	ctx := t.Context()
	q := sqs.NewFromConfig(awsConfig(), func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
	p := &pipeline{sqs: q}

	dlq, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + "-usage-dlq")})
	if err != nil {
		t.Fatalf("create dead-letter queue: %v", err)
	}
	p.dlqURL = aws.ToString(dlq.QueueUrl)
	dlqARN := p.queueARN(t, p.dlqURL)
	redrive, _ := json.Marshal(map[string]string{"deadLetterTargetArn": dlqARN, "maxReceiveCount": strconv.Itoa(maxReceiveCount)})
	main, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName: aws.String(name + "-usage"),
		Attributes: map[string]string{
			"RedrivePolicy": string(redrive),
			// Short, so that failed messages come back (and reach the DLQ) within the test.
			"VisibilityTimeout": "1",
		},
	})
	if err != nil {
		t.Fatalf("create usage queue: %v", err)
	}
	p.queueURL = aws.ToString(main.QueueUrl)
	return p
}

func (p *pipeline) queueARN(t *testing.T, queueURL string) string {
	t.Helper()
	out, err := p.sqs.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queueURL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		t.Fatalf("queue ARN: %v", err)
	}
	return out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
}

// depth is the number of messages in a queue, visible or in flight.
func (p *pipeline) depth(ctx context.Context, queueURL string) (int, error) {
	out, err := p.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible},
	})
	if err != nil {
		return 0, err
	}
	a, _ := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
	b, _ := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return a + b, nil
}

// send puts raw message bodies on the usage queue, ten per call.
func (p *pipeline) send(t *testing.T, bodies []string) {
	t.Helper()
	for len(bodies) > 0 {
		n := min(10, len(bodies))
		var entries []sqstypes.SendMessageBatchRequestEntry
		for i, b := range bodies[:n] {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(b)})
		}
		out, err := p.sqs.SendMessageBatch(t.Context(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(p.queueURL), Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			t.Fatalf("SendMessageBatch: %v %+v", err, out)
		}
		bodies = bodies[n:]
	}
}

// consumer is the Lambda event source mapping, played by the test: it receives batches from
// the usage queue, hands them to the real aggregator handler (usage.Handler + usage.Aggregator),
// and deletes the messages the handler did not report as failed.
type consumer struct {
	p *pipeline
	h *usage.Handler

	mu       sync.Mutex
	bodies   []string // every body handled successfully, in order
	batches  []batchResult
	handled  atomic.Int64 // messages deleted after success
	errs     []error
	received atomic.Int64
}

type batchResult struct {
	bodies []string
	failed map[string]bool // bodies reported failed
}

func (c *consumer) run(ctx context.Context) {
	for ctx.Err() == nil {
		out, err := c.p.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(c.p.queueURL),
			MaxNumberOfMessages:         10,
			WaitTimeSeconds:             0, // moto serves one request at a time: no long polls
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameApproximateReceiveCount},
		})
		if err != nil {
			if ctx.Err() == nil {
				c.fail(fmt.Errorf("ReceiveMessage: %w", err))
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		if len(out.Messages) == 0 {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		c.received.Add(int64(len(out.Messages)))
		batch := events.SQSEvent{}
		for _, m := range out.Messages {
			batch.Records = append(batch.Records, events.SQSMessage{
				MessageId:     aws.ToString(m.MessageId),
				ReceiptHandle: aws.ToString(m.ReceiptHandle),
				Body:          aws.ToString(m.Body),
				Attributes:    m.Attributes,
				EventSource:   "aws:sqs",
			})
		}
		resp, err := c.h.Handle(ctx, batch)
		if err != nil {
			c.fail(fmt.Errorf("Handle returned an error for the whole batch: %w", err))
			continue
		}
		failed := map[string]bool{}
		for _, f := range resp.BatchItemFailures {
			failed[f.ItemIdentifier] = true
		}
		res := batchResult{failed: map[string]bool{}}
		var del []sqstypes.DeleteMessageBatchRequestEntry
		for i, m := range batch.Records {
			res.bodies = append(res.bodies, m.Body)
			if failed[m.MessageId] {
				res.failed[m.Body] = true
				continue
			}
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.ReceiptHandle)})
		}
		if len(del) > 0 {
			d, err := c.p.sqs.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(c.p.queueURL), Entries: del})
			if err != nil || len(d.Failed) > 0 {
				c.fail(fmt.Errorf("DeleteMessageBatch: %v %+v", err, d))
			}
		}
		c.mu.Lock()
		for _, m := range batch.Records {
			if !failed[m.MessageId] {
				c.bodies = append(c.bodies, m.Body)
			}
		}
		c.batches = append(c.batches, res)
		c.mu.Unlock()
		c.handled.Add(int64(len(del)))
	}
}

func (c *consumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

func (c *consumer) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, err := range c.errs {
		t.Errorf("consumer: %v", err)
	}
}

func (c *consumer) handledBodies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.bodies...)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// faultyQueue is a proxy in front of moto's SQS endpoint. While failing, it answers every other
// SendMessageBatch with a 500, and the others by forwarding only every second entry and
// reporting the rest refused (Failed, Code InternalError), as SQS does under trouble.
type faultyQueue struct {
	srv          *httptest.Server
	target       *url.URL
	proxy        *httputil.ReverseProxy
	failing      atomic.Bool
	failingCalls atomic.Int64 // SendMessageBatch calls while failing
	errors       atomic.Int64 // calls answered 500
	refused      atomic.Int64 // entries reported failed
}

func newFaultyQueue(t *testing.T, target string) *faultyQueue {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	f := &faultyQueue{target: u, proxy: httputil.NewSingleHostReverseProxy(u)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *faultyQueue) serve(w http.ResponseWriter, r *http.Request) {
	if !f.failing.Load() || r.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" {
		f.proxy.ServeHTTP(w, r)
		return
	}
	// Calls alternate between the two faults from the first failing one on, so that both show
	// however few calls the failing window sees.
	if f.failingCalls.Add(1)%2 == 0 {
		f.errors.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"__type":"com.amazonaws.sqs#InternalError","message":"injected by the test"}`)
		return
	}
	var in map[string]json.RawMessage
	body, _ := io.ReadAll(r.Body)
	var entries []struct {
		ID string `json:"Id"`
	}
	if err := json.Unmarshal(body, &in); err != nil || json.Unmarshal(in["Entries"], &entries) != nil {
		http.Error(w, "bad request body", http.StatusBadRequest)
		return
	}
	var raw []json.RawMessage
	_ = json.Unmarshal(in["Entries"], &raw)
	var forward []json.RawMessage
	var failed []map[string]any
	for i, e := range raw {
		// Every second entry is refused; a lone entry is refused too.
		if i%2 == 0 && len(raw) > 1 {
			forward = append(forward, e)
			continue
		}
		failed = append(failed, map[string]any{"Id": entries[i].ID, "SenderFault": false, "Code": "InternalError", "Message": "injected by the test"})
	}
	f.refused.Add(int64(len(failed)))
	out := map[string]any{"Successful": []any{}, "Failed": failed}
	if len(forward) > 0 {
		in["Entries"], _ = json.Marshal(forward)
		fwdBody, _ := json.Marshal(in)
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, f.target.String()+r.URL.Path, bytes.NewReader(fwdBody))
		req.Header = r.Header.Clone()
		req.Header.Del("Content-Length")
		req.ContentLength = int64(len(fwdBody))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var moto struct {
			Successful []json.RawMessage `json:"Successful"`
			Failed     []json.RawMessage `json:"Failed"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&moto); err != nil || len(moto.Successful)+len(moto.Failed) != len(forward) {
			http.Error(w, fmt.Sprintf("moto answered %d entries: %v", len(moto.Successful), err), http.StatusBadGateway)
			return
		}
		out["Successful"] = moto.Successful
		for _, m := range moto.Failed {
			var x map[string]any
			_ = json.Unmarshal(m, &x)
			failed = append(failed, x)
		}
		out["Failed"] = failed
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	json.NewEncoder(w).Encode(out)
}

// countingProxy stands in front of DynamoDB Local and counts the calls made through it, by
// operation (the X-Amz-Target header's action).
type countingProxy struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	c := &countingProxy{calls: map[string]int{}}
	proxy := httputil.NewSingleHostReverseProxy(u)
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := r.Header.Get("X-Amz-Target")
		if _, action, ok := strings.Cut(op, "."); ok {
			op = action
		}
		c.mu.Lock()
		c.calls[op]++
		c.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// snapshot returns the counts so far, by operation.
func (c *countingProxy) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.calls)
}
