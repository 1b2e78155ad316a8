// Package awsenv resolves the endpoint overrides of AWS services from the environment, as the AWS
// SDKs document them (AWS_ENDPOINT_URL_<SERVICE>, then AWS_ENDPOINT_URL, both off when
// AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is true), after Kiln's own KILN_*_ENDPOINT names.
//
// The SDK would apply AWS_ENDPOINT_URL* by itself; Kiln resolves them here so that the stores
// know they talk to a local server (fixed credentials, no response checksums, tables created on
// demand) whichever of the names set the endpoint.
package awsenv

import "strings"

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
