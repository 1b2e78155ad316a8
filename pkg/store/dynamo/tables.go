package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/store"
)

// TableDefinitions returns the CreateTable inputs of the store's tables, on-demand capacity.
// In AWS the tables come from the deployment template (with point-in-time recovery on the ledger
// and usage tables, see docs/dynamodb.md); these definitions serve local servers and tests. The
// usage table has a stream of new images: the usage pipeline reads it (an EventBridge Pipe on
// AWS, pkg/usage/pipe locally).
func TableDefinitions(t Tables) []*dynamodb.CreateTableInput {
	attr := func(name string, typ types.ScalarAttributeType) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: typ}
	}
	key := func(hash, rng string) []types.KeySchemaElement {
		k := []types.KeySchemaElement{{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash}}
		if rng != "" {
			k = append(k, types.KeySchemaElement{AttributeName: aws.String(rng), KeyType: types.KeyTypeRange})
		}
		return k
	}
	index := func(name, hash, rng string) types.GlobalSecondaryIndex {
		return types.GlobalSecondaryIndex{
			IndexName:  aws.String(name),
			KeySchema:  key(hash, rng),
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}
	}
	const s = types.ScalarAttributeTypeS
	return []*dynamodb.CreateTableInput{
		{
			TableName:            aws.String(t.Orgs),
			AttributeDefinitions: []types.AttributeDefinition{attr("pk", s), attr("sk", s)},
			KeySchema:            key("pk", "sk"),
		},
		{
			TableName:              aws.String(t.Keys),
			AttributeDefinitions:   []types.AttributeDefinition{attr("pk", s), attr("org_id", s), attr("key_id", s)},
			KeySchema:              key("pk", ""),
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{index(KeysByOrgIndex, "org_id", "key_id")},
		},
		{
			TableName:            aws.String(t.Ledger),
			AttributeDefinitions: []types.AttributeDefinition{attr("org_id", s), attr("entry_id", s)},
			KeySchema:            key("org_id", "entry_id"),
		},
		{
			TableName:            aws.String(t.Usage),
			AttributeDefinitions: []types.AttributeDefinition{attr("org_id", s), attr("generation_id", s)},
			KeySchema:            key("org_id", "generation_id"),
			// New images: all the usage pipeline reads.
			StreamSpecification: &types.StreamSpecification{StreamEnabled: aws.Bool(true), StreamViewType: types.StreamViewTypeNewImage},
		},
		{
			TableName:            aws.String(t.Aggregates),
			AttributeDefinitions: []types.AttributeDefinition{attr("pk", s), attr("sk", s)},
			KeySchema:            key("pk", "sk"),
		},
	}
}

// CreateTables creates those of the store's tables that do not exist yet and waits until every
// one is active. It returns the names of the tables it created.
func (s *Store) CreateTables(ctx context.Context) ([]string, error) {
	var created []string
	for _, def := range TableDefinitions(s.tables) {
		def.BillingMode = types.BillingModePayPerRequest
		_, err := s.db.CreateTable(ctx, def)
		var inUse *types.ResourceInUseException
		switch {
		case errors.As(err, &inUse):
			if def.StreamSpecification != nil {
				if err := s.enableStream(ctx, aws.ToString(def.TableName), def.StreamSpecification); err != nil {
					return created, err
				}
			}
		case err != nil:
			return created, fmt.Errorf("create table %s: %w", aws.ToString(def.TableName), err)
		default:
			created = append(created, aws.ToString(def.TableName))
		}
	}
	w := dynamodb.NewTableExistsWaiter(s.db, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 100*time.Millisecond, time.Second
	})
	for _, def := range TableDefinitions(s.tables) {
		if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: def.TableName}, time.Minute); err != nil {
			return created, fmt.Errorf("wait for table %s: %w", aws.ToString(def.TableName), err)
		}
	}
	return created, nil
}

// enableStream turns on the stream of an existing table made before it had one.
func (s *Store) enableStream(ctx context.Context, table string, spec *types.StreamSpecification) error {
	out, err := s.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table})
	if err != nil {
		return fmt.Errorf("describe table %s: %w", table, err)
	}
	if cur := out.Table.StreamSpecification; cur != nil && aws.ToBool(cur.StreamEnabled) {
		return nil
	}
	_, err = s.db.UpdateTable(ctx, &dynamodb.UpdateTableInput{TableName: &table, StreamSpecification: spec})
	return store.Wrapf(err, "enable the stream of table %s", table)
}

// SetUpLocal prepares a local server's tables as template.yaml prepares AWS's: it creates those
// that are missing and turns point-in-time recovery on where the server has it (pitr is false
// where it has none, as on DynamoDB Local). It returns the names of the tables it created.
func (s *Store) SetUpLocal(ctx context.Context) (created []string, pitr bool, err error) {
	if created, err = s.CreateTables(ctx); err != nil {
		return nil, false, fmt.Errorf("create tables: %w", err)
	}
	switch err := s.EnablePointInTimeRecovery(ctx); {
	case errors.Is(err, ErrNoPointInTimeRecovery):
		return created, false, nil
	case err != nil:
		return created, false, err
	}
	return created, true, nil
}
