package config

import (
	"context"
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

// OpenStore opens the store the configuration names. The embedded store shares its directory:
// kilnctl's, and the Lambda gateway's (whose process is frozen between invocations, so it keeps
// its slots in the database). Without a bus it folds usage at settlement. Opening the DynamoDB
// store does not call DynamoDB; the first request finds out whether the tables and credentials
// are there.
func OpenStore(ctx context.Context, c Config) (store.Store, error) {
	return openStore(ctx, c, sqlite.Options{FoldAtSettlement: c.FoldsAtSettlement()})
}

// gatewayCommitWindow is how long the gateway's embedded store waits for more settlements to
// share a commit: none. A settlement now commits before its answer ends (its debit is durable
// when the client sees the end), so a window would be added to every answer, and under a closed
// loop of clients, who wait for their answers, no more settlements arrive during it. Writes that
// arrive while a commit is under way still share the next one.
const gatewayCommitWindow = 0

// OpenServerStore is OpenStore for the gateway's local server, a long-running process. The
// embedded store then owns the directory's in-flight slots (in memory, behind a lock file: one
// gateway per directory) and shares commits among the settlements that arrive during one.
func OpenServerStore(ctx context.Context, c Config) (store.Store, error) {
	return openStore(ctx, c, sqlite.Options{
		OwnSlots:         true,
		CommitWindow:     gatewayCommitWindow,
		FoldAtSettlement: c.FoldsAtSettlement(),
	})
}

func openStore(ctx context.Context, c Config, embedded sqlite.Options) (store.Store, error) {
	switch c.Store {
	case StoreSQLite:
		s, err := sqlite.OpenWith(c.DataDir, embedded)
		if err != nil {
			return nil, fmt.Errorf("open embedded store in %s: %w", c.DataDir, err)
		}
		return s, nil
	case StoreDynamoDB:
		s, err := dynamo.Open(ctx, dynamoConfig(c))
		if err != nil {
			return nil, fmt.Errorf("open DynamoDB store (tables %s*): %w", c.TablePrefix, err)
		}
		return s, nil
	}
	return nil, fmt.Errorf("KILN_STORE=%q: unknown store", c.Store)
}

// FoldsAtSettlement reports whether the store folds each settled event into its own aggregates
// as it settles it: the embedded store always (it has no stream to carry events on). The
// DynamoDB store's usage table streams its items to the aggregator instead.
func (c Config) FoldsAtSettlement() bool {
	return c.Store == StoreSQLite
}

func dynamoConfig(c Config) dynamo.Config {
	return dynamo.Config{TablePrefix: c.TablePrefix, Endpoint: c.DynamoDBEndpoint, Region: c.Region}
}

// LocalTables is what CreateLocalTables did.
type LocalTables struct {
	Tables  dynamo.Tables
	Created []string // the tables that did not exist
	// PointInTimeRecovery is true when every table has it on; false on a server that has none
	// (Amazon DynamoDB Local), which then cannot export either.
	PointInTimeRecovery bool
}

// CreateLocalTables creates the DynamoDB tables that do not exist yet on a local endpoint
// (KILN_DYNAMODB_ENDPOINT or the SDK's AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL: DynamoDB
// Local, moto), waits until they are active and turns point-in-time recovery on for each, as
// template.yaml does, where the server has it. It returns the names of every table of the store
// and of those it created. In AWS the tables come from the deployment template, so without an
// endpoint it refuses.
func CreateLocalTables(ctx context.Context, c Config) (all dynamo.Tables, created []string, err error) {
	lt, err := CreateLocal(ctx, c)
	return lt.Tables, lt.Created, err
}

// CreateLocal is CreateLocalTables, saying also whether point-in-time recovery is on.
func CreateLocal(ctx context.Context, c Config) (LocalTables, error) {
	if c.Store != StoreDynamoDB {
		return LocalTables{}, fmt.Errorf("KILN_STORE=%q: tables are created only for the DynamoDB store (KILN_STORE=dynamodb)", c.Store)
	}
	if c.DynamoDBEndpoint == "" {
		return LocalTables{}, errors.New("KILN_DYNAMODB_ENDPOINT (or AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL) is not set: tables are created here only on a local endpoint; in AWS they come from template.yaml")
	}
	s, err := dynamo.Open(ctx, dynamoConfig(c))
	if err != nil {
		return LocalTables{}, err
	}
	lt := LocalTables{Tables: s.Tables()}
	lt.Created, err = s.CreateTables(ctx)
	if err != nil {
		return lt, fmt.Errorf("create tables on %s: %w", c.DynamoDBEndpoint, err)
	}
	switch err := s.EnablePointInTimeRecovery(ctx); {
	case errors.Is(err, dynamo.ErrNoPointInTimeRecovery):
	case err != nil:
		return lt, fmt.Errorf("on %s: %w", c.DynamoDBEndpoint, err)
	default:
		lt.PointInTimeRecovery = true
	}
	return lt, nil
}
