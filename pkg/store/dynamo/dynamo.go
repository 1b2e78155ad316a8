// Package dynamo is the DynamoDB store: the same store.Store the embedded SQLite store is, on five
// DynamoDB tables, for the gateway on AWS Lambda and for kilnctl against production.
//
// Each request costs two round trips on the hot path: Admit is one TransactWriteItems that checks
// the organization (active, balance above zero) and takes a lease in the organization's lease map
// under its limit; Settle is one TransactWriteItems that releases that lease, debits the cost
// under a ledger entry keyed by the generation id, and records the usage item. When a transaction
// is cancelled, the reasons DynamoDB returns, with the items as they were
// (ReturnValuesOnConditionCheckFailure ALL_OLD), decide the answer: suspended, out of credits,
// slots full, already settled. Money is an integer number of picodollars in a DynamoDB number,
// times are Unix nanoseconds; neither is ever a float. docs/dynamodb.md describes the tables for
// operators and finance.
package dynamo

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/neocloud/kiln/pkg/awsenv"
)

// DefaultTablePrefix is the prefix of the table names unless configured otherwise.
const DefaultTablePrefix = "kiln-"

// Config says where the tables are.
type Config struct {
	// TablePrefix is prepended to the table names: "kiln-" makes kiln-orgs, kiln-keys,
	// kiln-ledger, kiln-usage and kiln-aggregates. Empty means DefaultTablePrefix.
	TablePrefix string
	// Endpoint overrides the DynamoDB endpoint (DynamoDB Local, moto). Empty means AWS.
	Endpoint string
	// Region is the AWS region; empty means the SDK's default, or us-east-1 with an Endpoint.
	Region string
	// APIOptions are added to every call's middleware stack (tests count round trips with them).
	APIOptions []func(*middleware.Stack) error
	// HTTPClient replaces the SDK's HTTP client when set.
	HTTPClient aws.HTTPClient
}

// Tables are the names of the store's tables.
type Tables struct {
	Orgs   string // organizations, their lease maps, the maintenance window
	Keys   string // API keys by SHA-256 hash, and key-ID claims
	Ledger string // every change to a balance
	Usage  string // one item per settled request
	// Aggregates holds the usage roll-ups and the fold's generation markers; only the
	// aggregator (and the in-process bus off Lambda) writes it.
	Aggregates string
}

// TableNames returns the table names for a prefix ("" means DefaultTablePrefix).
func TableNames(prefix string) Tables {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	return Tables{Orgs: prefix + "orgs", Keys: prefix + "keys", Ledger: prefix + "ledger", Usage: prefix + "usage",
		Aggregates: prefix + "aggregates"}
}

// Store is the DynamoDB store. It keeps no state between calls besides the client, so any number
// of Stores, in any number of processes, may use the same tables at once.
type Store struct {
	db     *dynamodb.Client
	tables Tables
}

// Open builds a DynamoDB client from the SDK's usual configuration (awsenv.Load) and returns a
// store on the configured tables. It does not call DynamoDB.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	awsCfg, err := awsenv.Load(ctx, cfg.Endpoint, cfg.Region)
	switch {
	case errors.Is(err, awsenv.ErrEndpoint):
		return nil, fmt.Errorf("dynamodb endpoint %q: want a URL such as http://127.0.0.1:8000", cfg.Endpoint)
	case err != nil:
		return nil, fmt.Errorf("open dynamodb store: %w", err)
	}
	client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			// Local servers send no response checksums; validating them only logs a warning per call.
			o.DisableValidateResponseChecksum = true
		}
		if cfg.HTTPClient != nil {
			o.HTTPClient = cfg.HTTPClient
		}
		o.APIOptions = append(o.APIOptions, cfg.APIOptions...)
	})
	return &Store{db: client, tables: TableNames(cfg.TablePrefix)}, nil
}

// Tables returns the names of the store's tables.
func (s *Store) Tables() Tables { return s.tables }

// Client returns the store's DynamoDB client.
func (s *Store) Client() *dynamodb.Client { return s.db }

// Close releases nothing: the store holds no connections of its own beyond the SDK's pool.
func (s *Store) Close() error { return nil }
