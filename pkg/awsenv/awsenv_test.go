package awsenv

import "testing"

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
