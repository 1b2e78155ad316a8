package dynamo

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// ErrNoPointInTimeRecovery reports a server without continuous backups: Amazon DynamoDB Local
// answers their operations with UnknownOperationException (moto and DynamoDB have them).
var ErrNoPointInTimeRecovery = errors.New("this DynamoDB server has no point-in-time recovery")

// EnablePointInTimeRecovery turns point-in-time recovery on for every table of the store, as
// template.yaml does in AWS: finance exports the tables with ExportTableToPointInTime, which
// DynamoDB refuses on a table without it. Turning it on where it is on already changes nothing.
func (s *Store) EnablePointInTimeRecovery(ctx context.Context) error {
	for _, name := range []string{s.tables.Orgs, s.tables.Keys, s.tables.Ledger, s.tables.Usage, s.tables.Aggregates} {
		_, err := s.db.UpdateContinuousBackups(ctx, &dynamodb.UpdateContinuousBackupsInput{
			TableName:                        aws.String(name),
			PointInTimeRecoverySpecification: &types.PointInTimeRecoverySpecification{PointInTimeRecoveryEnabled: aws.Bool(true)},
		})
		var api smithy.APIError
		switch {
		case errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException":
			return fmt.Errorf("point-in-time recovery of %s: %w", name, ErrNoPointInTimeRecovery)
		case err != nil:
			return fmt.Errorf("turn on point-in-time recovery of %s: %w", name, err)
		}
	}
	return nil
}
