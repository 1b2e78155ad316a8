package awsenv

import (
	"context"
	"errors"
	"testing"
)

func TestEndpointPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"nothing set is AWS", nil, ""},
		{"global", map[string]string{"AWS_ENDPOINT_URL": "http://g"}, "http://g"},
		{"service over global", map[string]string{"AWS_ENDPOINT_URL": "http://g", "AWS_ENDPOINT_URL_DYNAMODB": "http://d"}, "http://d"},
		{"another service's name is not ours", map[string]string{"AWS_ENDPOINT_URL_S3": "http://s3"}, ""},
		{"kiln name over both", map[string]string{"KILN_DYNAMODB_ENDPOINT": "http://k", "AWS_ENDPOINT_URL": "http://g", "AWS_ENDPOINT_URL_DYNAMODB": "http://d"}, "http://k"},
		{"ignored", map[string]string{"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true", "AWS_ENDPOINT_URL": "http://g", "AWS_ENDPOINT_URL_DYNAMODB": "http://d"}, ""},
		{"ignoring leaves the kiln name", map[string]string{"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "TRUE", "KILN_DYNAMODB_ENDPOINT": "http://k"}, "http://k"},
		{"false does not ignore", map[string]string{"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "false", "AWS_ENDPOINT_URL": "http://g"}, "http://g"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Endpoint(func(k string) string { return tc.env[k] }, "KILN_DYNAMODB_ENDPOINT", DynamoDB)
			if got != tc.want {
				t.Errorf("Endpoint = %q, want %q", got, tc.want)
			}
		})
	}
	if got := Endpoint(func(k string) string { return map[string]string{"AWS_ENDPOINT_URL_S3": "http://s3"}[k] }, "", S3); got != "http://s3" {
		t.Errorf("S3 without a kiln name = %q", got)
	}
}

func TestLoad(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"127.0.0.1:8000", "http://", "://x"} {
		if _, err := Load(ctx, bad, ""); !errors.Is(err, ErrEndpoint) {
			t.Errorf("Load(%q) = %v, want ErrEndpoint", bad, err)
		}
	}
	cfg, err := Load(ctx, "http://localhost:8000", "")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := cfg.Credentials.Retrieve(ctx)
	if err != nil || creds.AccessKeyID != "kilnlocal" || cfg.Region != "us-east-1" {
		t.Errorf("a loopback endpoint: region %q, credentials %q, %v; want us-east-1 and kilnlocal", cfg.Region, creds.AccessKeyID, err)
	}
	if cfg, err := Load(ctx, "http://127.0.0.1:5000", "eu-west-1"); err != nil || cfg.Region != "eu-west-1" {
		t.Errorf("a region with an endpoint = %q, %v", cfg.Region, err)
	}
}
