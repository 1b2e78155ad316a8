package finance

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/neocloud/kiln/pkg/awsenv"
)

// OpenS3 builds an S3 client from the SDK's usual configuration (awsenv.Load, which on a
// loopback endpoint uses fixed local credentials, as the DynamoDB store does). With an endpoint
// (a local server such as moto) it uses path-style addressing, which local servers need.
func OpenS3(ctx context.Context, endpoint, region string) (*s3.Client, error) {
	cfg, err := awsenv.Load(ctx, endpoint, region)
	switch {
	case errors.Is(err, awsenv.ErrEndpoint):
		return nil, fmt.Errorf("s3 endpoint %q: want a URL such as http://127.0.0.1:5000", endpoint)
	case err != nil:
		return nil, fmt.Errorf("open s3: %w", err)
	}
	return s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
			o.UsePathStyle = true
			// Local servers may send no checksums; validating them would only warn.
			o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		}
	}), nil
}
