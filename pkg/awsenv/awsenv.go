// Package awsenv resolves the endpoint overrides of AWS services from the environment, as the AWS
// SDKs document them (AWS_ENDPOINT_URL_<SERVICE>, then AWS_ENDPOINT_URL, both off when
// AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is true), after Kiln's own KILN_*_ENDPOINT names.
//
// The SDK would apply AWS_ENDPOINT_URL* by itself; Kiln resolves them here so that the stores
// know they talk to a local server (fixed credentials, no response checksums, tables created on
// demand) whichever of the names set the endpoint; Load builds the SDK configuration both the
// stores and finance's S3 reader open their clients with.
package awsenv

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Services whose endpoint Kiln overrides, by the SDK's service ID as the environment names it.
const (
	DynamoDB = "DYNAMODB"
	S3       = "S3"
)

// Endpoint returns the endpoint override of a service: kilnName's value (KILN_DYNAMODB_ENDPOINT,
// say) if set, else AWS_ENDPOINT_URL_<service>, else AWS_ENDPOINT_URL; "" means AWS's own
// endpoint. kilnName may be "" for a service Kiln has no name of its own for.
func Endpoint(getenv func(string) string, kilnName, service string) string {
	if kilnName != "" {
		if v := getenv(kilnName); v != "" {
			return v
		}
	}
	if strings.EqualFold(strings.TrimSpace(getenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")), "true") {
		return ""
	}
	if v := getenv("AWS_ENDPOINT_URL_" + service); v != "" {
		return v
	}
	return getenv("AWS_ENDPOINT_URL")
}

// ErrEndpoint is Load's error for an endpoint that is not a URL with a scheme and a host.
var ErrEndpoint = errors.New("endpoint: want a URL")

// Load reads the SDK's usual configuration (environment, shared files, the Lambda role) for a
// client of endpoint ("" means AWS's own) in region ("" means the SDK's default, or us-east-1
// with an endpoint). With a loopback endpoint it uses fixed local credentials: local servers
// accept any (DynamoDB Local wants letters and digits only), and the SDK's chain would otherwise
// look for a role.
func Load(ctx context.Context, endpoint, region string) (aws.Config, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if region != "" {
		opts = append(opts, awsconfig.WithRegion(region))
	}
	if endpoint != "" {
		u, err := url.Parse(endpoint)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return aws.Config{}, ErrEndpoint
		}
		if region == "" {
			opts = append(opts, awsconfig.WithRegion("us-east-1"))
		}
		if isLoopback(u.Hostname()) {
			opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("kilnlocal", "kilnlocal", "")))
		}
	}
	return awsconfig.LoadDefaultConfig(ctx, opts...)
}

// isLoopback reports whether host names this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
