package lambda

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

// TestBackendSecret runs the built gateway with KILN_BACKEND_SECRET naming a secret in moto's
// Secrets Manager and backends that demand its token: the token is read at run time (it is in no
// environment variable), and after a rotation the backend's 401 makes the gateway read it again,
// so that requests succeed again without a restart.
func TestBackendSecret(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	moto, err := dynamotest.StartMoto(ctx)
	if err != nil {
		t.Fatalf("cannot start moto: %v", err)
	}
	t.Cleanup(moto.Stop)
	sm := secretsmanager.New(secretsmanager.Options{
		Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("kilnlocal", "kilnlocal", ""),
		BaseEndpoint: aws.String(moto.Endpoint),
	})
	id := fmt.Sprintf("kiln/%d/backend", os.Getpid())
	created, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: &id, SecretString: aws.String("token-one")})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	want := "Bearer token-one"
	var refused int
	demand := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			ok := r.Header.Get("Authorization") == want
			if !ok {
				refused++
			}
			mu.Unlock()
			if !ok {
				http.Error(w, "bad token", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	withKey := func(cat string) string {
		return strings.ReplaceAll(cat, "\n        url: ", "\n        api_key_env: KILN_BACKEND_API_KEY\n        url: ")
	}
	s := startGatewayWith(t, demand, withKey,
		"KILN_BACKEND_SECRET="+aws.ToString(created.ARN),
		"AWS_ENDPOINT_URL_SECRETS_MANAGER="+moto.Endpoint,
		"AWS_ACCESS_KEY_ID=kilnlocal", "AWS_SECRET_ACCESS_KEY=kilnlocal")
	status := func() int {
		inv := s.fn.invoke(t, functionURLEvent(t, request{method: "POST", path: "/v1/chat/completions", headers: s.auth(),
			body: chat("qwen3-32b", "hello", 3, false)}), longDeadline)
		return checkStreamed(t, inv).StatusCode
	}
	if got := status(); got != http.StatusOK {
		t.Fatalf("with the secret's token: status %d, want 200", got)
	}

	// Rotation: the secret and the backend change together.
	if _, err := sm.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: &id, SecretString: aws.String("token-two")}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	want = "Bearer token-two"
	mu.Unlock()
	var statuses []int
	for i := 0; i < 20 && (len(statuses) == 0 || statuses[len(statuses)-1] != http.StatusOK); i++ {
		statuses = append(statuses, status())
	}
	if statuses[0] != http.StatusBadGateway || statuses[len(statuses)-1] != http.StatusOK {
		t.Errorf("after the rotation: statuses %v, want a 502 (the backend's 401), then 200 once the secret was read again", statuses)
	}
	if strings.Contains(s.fn.stderr.String(), "token-") {
		t.Error("a token reached the function's log")
	}
}

// TestMetricsLines: with KILN_METRICS_NAMESPACE (template.yaml sets it), the built gateway writes
// one Embedded Metric Format line per request to its output, which Lambda sends to the
// function's log group, where CloudWatch turns it into metrics.
func TestMetricsLines(t *testing.T) {
	s := startGatewayWith(t, nil, nil, "KILN_METRICS_NAMESPACE=Kiln/test")
	inv := s.fn.invoke(t, functionURLEvent(t, request{method: "POST", path: "/v1/chat/completions", headers: s.auth(),
		body: chat("qwen3-32b", "hello", 3, false)}), longDeadline)
	if p := checkStreamed(t, inv); p.StatusCode != http.StatusOK {
		t.Fatalf("status %d", p.StatusCode)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(s.fn.stderr.String(), "\n") {
			if strings.HasPrefix(line, "{") && strings.Contains(line, `"_aws"`) && strings.Contains(line, `"Namespace":"Kiln/test"`) &&
				strings.Contains(line, `"Requests":1`) && strings.Contains(line, `"StatusClass":"2xx"`) {
				return
			}
		}
	}
	t.Errorf("no metrics line in the function's output:\n%s", s.fn.stderr.String())
}
