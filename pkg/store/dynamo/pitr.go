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
// DynamoDB refuses on a table without it. A table that has it already is left alone.
func (s *Store) EnablePointInTimeRecovery(ctx context.Context) error {
	for _, name := range []string{s.tables.Orgs, s.tables.Keys, s.tables.Ledger, s.tables.Usage, s.tables.Aggregates} {
		on, err := s.PointInTimeRecovery(ctx, name)
		if err != nil {
			return err
		}
		if on {
			continue
		}
		if _, err := s.db.UpdateContinuousBackups(ctx, &dynamodb.UpdateContinuousBackupsInput{
			TableName:                        aws.String(name),
			PointInTimeRecoverySpecification: &types.PointInTimeRecoverySpecification{PointInTimeRecoveryEnabled: aws.Bool(true)},
		}); err != nil {
			return fmt.Errorf("turn on point-in-time recovery of %s: %w", name, err)
		}
	}
	return nil
}

// PointInTimeRecovery reports whether point-in-time recovery is on for the named table.
func (s *Store) PointInTimeRecovery(ctx context.Context, table string) (bool, error) {
	out, err := s.db.DescribeContinuousBackups(ctx, &dynamodb.DescribeContinuousBackupsInput{TableName: aws.String(table)})
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException" {
		return false, fmt.Errorf("point-in-time recovery of %s: %w", table, ErrNoPointInTimeRecovery)
	}
	if err != nil {
		return false, fmt.Errorf("point-in-time recovery of %s: %w", table, err)
	}
	d := out.ContinuousBackupsDescription
	return d != nil && d.PointInTimeRecoveryDescription != nil &&
		d.PointInTimeRecoveryDescription.PointInTimeRecoveryStatus == types.PointInTimeRecoveryStatusEnabled, nil
}
