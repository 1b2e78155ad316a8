package dynamo_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/usage"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// calls counts the DynamoDB calls a store makes, by operation: each try the SDK sends is one
// round trip, so the counter sits after the SDK's retry middleware.
type calls struct {
	mu  sync.Mutex
	ops map[string]int
}

func (c *calls) option(stack *middleware.Stack) error {
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("KilnCountCalls",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.mu.Lock()
			if c.ops == nil {
				c.ops = map[string]int{}
			}
			c.ops[awsmiddleware.GetOperationName(ctx)]++
			c.mu.Unlock()
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// take returns the counts so far and starts again from zero.
func (c *calls) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops := c.ops
	c.ops = nil
	return ops
}

func total(ops map[string]int) int {
	n := 0
	for _, v := range ops {
		n += v
	}
	return n
}

// loseResponse is an HTTP client that, while armed, lets one request of the named operation
// reach the server and then drops its response, reporting a connection reset instead — as when
// a network fails after DynamoDB committed. The SDK retries such a request.
type loseResponse struct {
	op    string
	armed atomic.Bool
	lost  atomic.Int64
}

func (l *loseResponse) Do(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(req.Header.Get("X-Amz-Target"), "."+l.op) && l.armed.CompareAndSwap(true, false) {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		l.lost.Add(1)
		return nil, errors.New("read tcp: connection reset by peer")
	}
	return resp, nil
}

func mustCreateOrg(t *testing.T, s store.Store, id string, limit int, balance money.Amount) {
	t.Helper()
	if err := s.CreateOrg(t.Context(), store.Org{ID: id, Name: "Org " + id, MaxInFlight: limit, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if balance != 0 {
		if err := s.AddEntry(t.Context(), store.LedgerEntry{ID: "initial", OrgID: id, Kind: store.EntryTopUp, Amount: balance, At: t0}); err != nil {
			t.Fatal(err)
		}
	}
}

func mustAdmit(t *testing.T, s store.Store, org, holder string, now time.Time, ttl time.Duration) store.Lease {
	t.Helper()
	l, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: org, HolderID: holder, Now: now, TTL: ttl})
	if err != nil {
		t.Fatalf("Admit(%s, %s): %v", org, holder, err)
	}
	return l
}

func testEvent(org, gen string, cost money.Amount) usage.Event {
	return usage.Event{
		Version: usage.SchemaVersion, GenerationID: gen, OrgID: org, KeyID: "kiln-AbC123xY",
		Model: "qwen3-32b", Endpoint: "/v1/chat/completions", Stream: true, Status: usage.StatusCompleted,
		HTTPStatus: 200, FinishReason: "stop", PromptTokens: 1200, CompletionTokens: 300, Cost: cost,
		StartedAt: t0, TTFTMillis: 180, DurationMillis: 2400, Backend: "vllm-a",
	}
}

// rawLeases reads an organization's lease map straight from the table, expired leases included:
// holder → expiry.
func rawLeases(t *testing.T, s *dynamo.Store, org string) map[string]string {
	t.Helper()
	out, err := s.Client().GetItem(t.Context(), &dynamodb.GetItemInput{
		TableName:      aws.String(s.Tables().Orgs),
		Key:            map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: org}, "sk": &types.AttributeValueMemberS{Value: "org"}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("read org item of %s: %v", org, err)
	}
	m, ok := out.Item["leases"].(*types.AttributeValueMemberM)
	if !ok {
		t.Fatalf("org item of %s has no lease map: %v", org, out.Item)
	}
	leases := map[string]string{}
	for h, v := range m.Value {
		leases[h] = v.(*types.AttributeValueMemberM).Value["e"].(*types.AttributeValueMemberN).Value
	}
	return leases
}

// rawItems counts an organization's items in the ledger or usage table, read straight from it.
func rawItems(t *testing.T, s *dynamo.Store, table, org string) []map[string]types.AttributeValue {
	t.Helper()
	out, err := s.Client().Query(t.Context(), &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("org_id = :org"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":org": &types.AttributeValueMemberS{Value: org}},
		ConsistentRead:            aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("query %s: %v", table, err)
	}
	return out.Items
}
