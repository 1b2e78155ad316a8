package main

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store/dynamo"
)

// devCreateTables answers "kilnctl dev create-tables": on a local DynamoDB endpoint it creates
// the tables that are missing and turns point-in-time recovery on where the server has it, as
// template.yaml does. In AWS the tables come from template.yaml, so it refuses to run without
// KILN_DYNAMODB_ENDPOINT.
func devCreateTables(ctx context.Context, c *cli, f *flags, args []string) error {
	if _, err := f.parse(args); err != nil {
		return err
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	if cfg.Store != config.StoreDynamoDB {
		return fmt.Errorf("KILN_STORE=%q: tables are created only for the DynamoDB store (KILN_STORE=dynamodb)", cfg.Store)
	}
	if cfg.DynamoDBEndpoint == "" {
		return errors.New("KILN_DYNAMODB_ENDPOINT (or AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL) is not set: tables are created here only on a local endpoint; in AWS they come from template.yaml")
	}
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	ds := st.(*dynamo.Store)
	tables := ds.Tables()
	created, pitr, err := ds.SetUpLocal(ctx)
	if err != nil {
		return fmt.Errorf("on %s: %w", cfg.DynamoDBEndpoint, err)
	}
	type tableJSON struct {
		Name    string `json:"name"`
		Created bool   `json:"created"`
	}
	var list []tableJSON
	for _, name := range []string{tables.Orgs, tables.Keys, tables.Ledger, tables.Usage, tables.Aggregates} {
		list = append(list, tableJSON{Name: name, Created: slices.Contains(created, name)})
	}
	if *f.json {
		return writeJSON(c.stdout, struct {
			Endpoint            string      `json:"endpoint"`
			Tables              []tableJSON `json:"tables"`
			PointInTimeRecovery bool        `json:"point_in_time_recovery"`
		}{cfg.DynamoDBEndpoint, list, pitr})
	}
	for _, t := range list {
		what := "exists"
		if t.Created {
			what = "created"
		}
		if err := c.printf("%s\t%s\n", t.Name, what); err != nil {
			return err
		}
	}
	say := "point-in-time recovery on (finance export works)"
	if !pitr {
		say = "point-in-time recovery: this server has none (Amazon DynamoDB Local); finance export needs moto or AWS"
	}
	return c.printf("%s\n", say)
}
