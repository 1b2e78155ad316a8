package config

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// share a commit: they run after the response, so nobody waits for it. A commit costs about as
// much CPU as several settlements (a WAL frame, checksummed, for every page the batch touched);
// at a few thousand requests a second, 5 ms puts a few dozen settlements in each. In four pairs
// of alternating kilnbench runs the gateway spent 6-18 % less CPU per request (as a ratio to the
// simulator's) than with 1 ms.
const gatewayCommitWindow = 5 * time.Millisecond

// OpenServerStore is OpenStore for the gateway's local server, a long-running process. The
// embedded store then owns the directory's in-flight slots (in memory, behind a lock file: one
// gateway per directory) and shares commits over a short window.
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

// CreateLocalTables creates the DynamoDB tables that do not exist yet on a local endpoint
// (KILN_DYNAMODB_ENDPOINT: DynamoDB Local, moto) and waits until they are active. It returns the
// names of every table of the store and of those it created. In AWS the tables come from the
// deployment template, so without an endpoint it refuses.
func CreateLocalTables(ctx context.Context, c Config) (all dynamo.Tables, created []string, err error) {
	if c.Store != StoreDynamoDB {
		return dynamo.Tables{}, nil, fmt.Errorf("KILN_STORE=%q: tables are created only for the DynamoDB store (KILN_STORE=dynamodb)", c.Store)
	}
	if c.DynamoDBEndpoint == "" {
		return dynamo.Tables{}, nil, errors.New("KILN_DYNAMODB_ENDPOINT is not set: tables are created here only on a local endpoint; in AWS they come from template.yaml")
	}
	s, err := dynamo.Open(ctx, dynamoConfig(c))
	if err != nil {
		return dynamo.Tables{}, nil, err
	}
	created, err = s.CreateTables(ctx)
	if err != nil {
		return s.Tables(), created, fmt.Errorf("create tables on %s: %w", c.DynamoDBEndpoint, err)
	}
	return s.Tables(), created, nil
}
