package lambda

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/neocloud/kiln/pkg/usage"
)

// TestUsageEventSchema keeps events/usage-event.schema.json and pkg/usage.Event in step: the
// same fields, all required, nothing else allowed.
func TestUsageEventSchema(t *testing.T) {
	var schema struct {
		Type                 string                     `json:"type"`
		AdditionalProperties *bool                      `json:"additionalProperties"`
		Required             []string                   `json:"required"`
		Properties           map[string]json.RawMessage `json:"properties"`
	}
	readJSON(t, "usage-event.schema.json", &schema)
	fields := usage.EventFields()
	if schema.Type != "object" || schema.AdditionalProperties == nil || *schema.AdditionalProperties {
		t.Errorf("schema: want an object with additionalProperties false")
	}
	if !slices.Equal(schema.Required, fields) {
		t.Errorf("schema required %v\nusage.Event fields %v", schema.Required, fields)
	}
	var props []string
	for k := range schema.Properties {
		props = append(props, k)
	}
	slices.Sort(props)
	sorted := slices.Sorted(slices.Values(fields))
	if !slices.Equal(props, sorted) {
		t.Errorf("schema properties %v\nusage.Event fields %v", props, sorted)
	}
}

// TestSamplePayloads decodes the sample invocation payloads with aws-lambda-go's types and
// checks that they say what docs/deploy.md says they do. (The gateway tests send them too, with
// their own path, headers and body.)
func TestSamplePayloads(t *testing.T) {
	var url events.LambdaFunctionURLRequest
	readJSON(t, "function-url-request.json", &url)
	if url.Version != "2.0" || url.RequestContext.HTTP.Method != "POST" || url.RawPath != "/v1/chat/completions" || url.Body == "" {
		t.Errorf("function URL sample: version %q, %s %s", url.Version, url.RequestContext.HTTP.Method, url.RawPath)
	}
	var rest events.APIGatewayProxyRequest
	readJSON(t, "rest-api-request.json", &rest)
	if rest.HTTPMethod != "POST" || rest.Path != "/v1/chat/completions" || rest.Resource != "/{proxy+}" || rest.Body == "" {
		t.Errorf("REST API sample: %s %s (resource %s)", rest.HTTPMethod, rest.Path, rest.Resource)
	}

	for _, sample := range []struct {
		file                string
		valid, skip, failed int
	}{
		{"sqs-pipe-usage-batch.json", 2, 1, 2}, // the pipe's stream records; one of a running request
		{"sqs-usage-batch.json", 2, 0, 2},      // EventBridge envelopes from before the pipe
	} {
		var batch events.SQSEvent
		readJSON(t, sample.file, &batch)
		var ok, skip, bad []string
		for _, m := range batch.Records {
			_, err := usage.Decode([]byte(m.Body))
			switch {
			case errors.Is(err, usage.ErrNotFinal):
				skip = append(skip, m.MessageId)
			case err != nil:
				bad = append(bad, m.MessageId)
			default:
				ok = append(ok, m.MessageId)
			}
		}
		if len(ok) != sample.valid || len(skip) != sample.skip || len(bad) != sample.failed {
			t.Errorf("%s: %d valid %v, %d skipped %v, %d failing %v; want %d, %d and %d", sample.file, len(ok), ok, len(skip), skip,
				len(bad), bad, sample.valid, sample.skip, sample.failed)
		}
	}
}
