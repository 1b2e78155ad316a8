package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/neocloud/kiln/pkg/config"
)

// devCreateTables answers "kilnctl dev create-tables": on a local DynamoDB endpoint it creates
// the tables that are missing and turns point-in-time recovery on where the server has it. In AWS the tables come from template.yaml, so it refuses to run
// without KILN_DYNAMODB_ENDPOINT.
func devCreateTables(ctx context.Context, c *cli, f *flags, args []string) error {
	if _, err := f.parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(c.getenv)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	lt, err := config.CreateLocal(ctx, cfg)
	if err != nil {
		return err
	}
	tables, created := lt.Tables, lt.Created
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
		}{cfg.DynamoDBEndpoint, list, lt.PointInTimeRecovery})
	}
	for _, t := range list {
		what := "exists"
		if t.Created {
			what = "created"
		}
		if _, err := fmt.Fprintf(c.stdout, "%s\t%s\n", t.Name, what); err != nil {
			return err
		}
	}
	pitr := "point-in-time recovery on (finance export works)"
	if !lt.PointInTimeRecovery {
		pitr = "point-in-time recovery: this server has none (Amazon DynamoDB Local); finance export needs moto or AWS"
	}
	_, err = fmt.Fprintln(c.stdout, pitr)
	return err
}
