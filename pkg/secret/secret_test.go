package secret_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/neocloud/kiln/pkg/secret"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

var moto *dynamotest.Server

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	var err error
	moto, err = dynamotest.StartMoto(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start moto: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	moto.Stop()
	os.Exit(code)
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func client() *secretsmanager.Client {
	return secretsmanager.New(secretsmanager.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("kilnlocal", "kilnlocal", ""),
		BaseEndpoint: aws.String(moto.Endpoint),
	})
}

// setEnv points the SDK's usual configuration, which Open reads, at moto.
func setEnv(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", "kilnlocal")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "kilnlocal")
}

func put(t *testing.T, c *secretsmanager.Client, id, value string) {
	t.Helper()
	if _, err := c.PutSecretValue(t.Context(), &secretsmanager.PutSecretValueInput{SecretId: &id, SecretString: &value}); err != nil {
		t.Fatal(err)
	}
}

// TestRotation: on moto's Secrets Manager, the token is read once, served from the cache, read
// again after a backend refused it (at most once per gap) and when it is older than the refresh
// interval (time passed in); a value that is no bearer token keeps the one read before.
func TestRotation(t *testing.T) {
	setEnv(t)
	c := client()
	id := fmt.Sprintf("kiln/%d/backend", os.Getpid())
	out, err := c.CreateSecret(t.Context(), &secretsmanager.CreateSecretInput{Name: &id, SecretString: aws.String("tok-1\n")})
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	s, err := secret.Open(t.Context(), aws.ToString(out.ARN), "us-east-1", secret.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Token(); got != "tok-1" {
		t.Fatalf("token %q, want tok-1 (the trailing newline dropped)", got)
	}

	put(t, c, id, "tok-2")
	if got := s.Token(); got != "tok-1" {
		t.Errorf("token %q before any reason to read again, want the cached tok-1", got)
	}
	s.Refused() // the first refusal reads at once, however recent the last read
	s.Wait()
	if got := s.Token(); got != "tok-2" {
		t.Errorf("after a refusal: token %q, want tok-2", got)
	}

	put(t, c, id, "tok-3")
	s.Refused() // within the gap of the last read: not read again
	s.Wait()
	if got := s.Token(); got != "tok-2" {
		t.Errorf("a second refusal within %v read the secret again: %q", secret.RefusedGap, got)
	}
	clk.Add(secret.RefreshEvery)
	if got := s.Token(); got != "tok-2" {
		t.Errorf("the request that finds the token old waits for nothing: got %q, want tok-2", got)
	}
	s.Wait()
	if got := s.Token(); got != "tok-3" {
		t.Errorf("after the refresh interval: token %q, want tok-3", got)
	}

	put(t, c, id, "two words")
	err = s.Refresh(t.Context())
	if err == nil || !strings.Contains(err.Error(), "not a bearer token") {
		t.Errorf("a value with a space: %v, want a refusal", err)
	}
	if got := s.Token(); got != "tok-3" {
		t.Errorf("after a bad value: token %q, want tok-3 kept", got)
	}
}

// TestOpen reads through the SDK's usual configuration, AWS_ENDPOINT_URL_SECRETS_MANAGER
// included, and refuses at start a secret it cannot read, naming it.
func TestOpen(t *testing.T) {
	setEnv(t)
	id := fmt.Sprintf("kiln/%d/open", os.Getpid())
	if _, err := client().CreateSecret(t.Context(), &secretsmanager.CreateSecretInput{Name: &id, SecretString: aws.String("tok")}); err != nil {
		t.Fatal(err)
	}
	s, err := secret.Open(t.Context(), id, "us-east-1", secret.Options{})
	if err != nil || s.Token() != "tok" {
		t.Fatalf("Open: %v", err)
	}
	if _, err := secret.Open(t.Context(), "kiln/missing", "us-east-1", secret.Options{}); err == nil || !strings.Contains(err.Error(), "kiln/missing") {
		t.Errorf("a missing secret: %v, want an error naming it", err)
	}
}
