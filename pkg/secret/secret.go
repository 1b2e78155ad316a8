// Package secret reads a bearer token from AWS Secrets Manager at run time, for the gateway's
// model backends: read once at start, cached, read again in the background when it is older
// than the refresh interval (5 minutes) and soon after a backend refuses it (401 or 403), so that
// a rotation reaches running gateways without a redeploy. The token is never in the function's
// environment. A Source is an upstream.TokenSource.
package secret

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/neocloud/kiln/pkg/awsenv"
)

// When a Source reads its secret again.
const (
	RefreshEvery = 5 * time.Minute  // a token older than this is read again
	RefusedGap   = 10 * time.Second // at most one re-read this often, on refusals or failed reads
)

// Options are what a Source is given; zero values take time.Now and a discarding log.
type Options struct {
	Now func() time.Time
	Log *slog.Logger
}

// Source is one secret's current value.
type Source struct {
	client *secretsmanager.Client
	id     string
	opt    Options

	mu         sync.Mutex
	token      string
	fetched    time.Time // when token was read
	tried      time.Time // when a read last started
	refusedAt  time.Time // when a refusal last started one
	refreshing bool
	wg         sync.WaitGroup
}

// Open builds a Secrets Manager client from the SDK's usual configuration (the Lambda role;
// AWS_ENDPOINT_URL_SECRETS_MANAGER for a local server) and reads the secret id (a name or ARN)
// once: a secret that cannot be read is an error at start, not a backend 401 later.
func Open(ctx context.Context, id, region string, opt Options) (*Source, error) {
	cfg, err := awsenv.Load(ctx, "", region)
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", id, err)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	s := &Source{client: secretsmanager.NewFromConfig(cfg), id: id, opt: opt}
	if err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Refresh reads the secret now. On error the token read before stays.
func (s *Source) Refresh(ctx context.Context) error {
	s.mu.Lock()
	s.tried = s.opt.Now()
	s.mu.Unlock()
	out, err := s.client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &s.id})
	if err != nil {
		return fmt.Errorf("read secret %s: %w", s.id, err)
	}
	tok, err := token(out)
	if err != nil {
		return fmt.Errorf("secret %s: %w", s.id, err)
	}
	s.mu.Lock()
	changed := s.token != "" && s.token != tok
	s.token, s.fetched = tok, s.opt.Now()
	s.mu.Unlock()
	if changed {
		s.opt.Log.Info("backend secret changed", slog.String("secret", s.id), slog.String("version", aws.ToString(out.VersionId)))
	}
	return nil
}

// token is the secret's value as a bearer token: its SecretString without surrounding white
// space (files often end in a newline), printable ASCII with no space inside.
func token(out *secretsmanager.GetSecretValueOutput) (string, error) {
	if out.SecretString == nil {
		return "", errors.New("no SecretString (a binary secret): store the token as a string")
	}
	tok := strings.TrimSpace(*out.SecretString)
	if tok == "" {
		return "", errors.New("the SecretString is empty")
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c <= ' ' || c >= 0x7f {
			return "", errors.New("the SecretString is not a bearer token: it holds a space, a control character or a non-ASCII byte")
		}
	}
	return tok, nil
}

// Token returns the current token, and starts a re-read in the background once it is older than
// RefreshEvery (the request that notices does not wait for it).
func (s *Source) Token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A failing read is tried again no sooner than RefusedGap, not on every request.
	if now := s.opt.Now(); now.Sub(s.fetched) >= RefreshEvery && now.Sub(s.tried) >= RefusedGap {
		s.refreshLocked("scheduled")
	}
	return s.token
}

// Refused starts a re-read in the background (at most one every RefusedGap): a backend refused
// the token, which a rotation explains.
func (s *Source) Refused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := s.opt.Now(); s.refusedAt.IsZero() || now.Sub(s.refusedAt) >= RefusedGap {
		if s.refreshLocked("a backend refused the token") {
			s.refusedAt = now
		}
	}
}

// refreshLocked starts a re-read unless one is running, and reports whether it did.
func (s *Source) refreshLocked(why string) bool {
	if s.refreshing {
		return false
	}
	s.refreshing = true
	s.tried = s.opt.Now()
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Refresh(ctx); err != nil {
			s.opt.Log.Warn("backend secret not re-read; the token read before stays", slog.String("why", why), slog.String("error", err.Error()))
		}
		s.mu.Lock()
		s.refreshing = false
		s.mu.Unlock()
	})
	return true
}
