package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

// TestOnDynamoDBLocal runs kilnctl against Amazon DynamoDB Local, started here: dev
// create-tables, then the operator scenario, the usage roll-ups and the refused inputs, each on
// tables of its own, exactly as they run on the embedded store.
func TestOnDynamoDBLocal(t *testing.T) {
	srv, err := dynamotest.StartDynamoDBLocal(t.Context())
	if err != nil {
		t.Fatalf("cannot start DynamoDB Local for kilnctl's tests: %v", err)
	}
	t.Cleanup(srv.Stop)
	var n atomic.Int64
	vars := func() map[string]string {
		return map[string]string{
			"KILN_STORE":             config.StoreDynamoDB,
			"KILN_DYNAMODB_ENDPOINT": srv.Endpoint,
			"KILN_TABLE_PREFIX":      fmt.Sprintf("kilnctl%d-", n.Add(1)),
			"AWS_REGION":             "us-east-1",
		}
	}

	t.Run("dev create-tables", func(t *testing.T) {
		e := &testEnv{t: t, vars: vars()}
		prefix := e.vars["KILN_TABLE_PREFIX"]
		var got struct {
			Endpoint string `json:"endpoint"`
			Tables   []struct {
				Name    string `json:"name"`
				Created bool   `json:"created"`
			} `json:"tables"`
			PointInTimeRecovery bool `json:"point_in_time_recovery"`
		}
		e.json(&got, "dev", "create-tables")
		if got.Endpoint != srv.Endpoint || len(got.Tables) != 5 {
			t.Fatalf("dev create-tables = %+v", got)
		}
		for i, name := range []string{"orgs", "keys", "ledger", "usage", "aggregates"} {
			if got.Tables[i].Name != prefix+name || !got.Tables[i].Created {
				t.Errorf("table %d = %+v, want %s created", i, got.Tables[i], prefix+name)
			}
		}
		// DynamoDB Local has no continuous backups: create-tables says so and goes on (on moto,
		// TestFinanceOnMoto checks that it turns point-in-time recovery on).
		if got.PointInTimeRecovery {
			t.Errorf("dev create-tables on DynamoDB Local claims point-in-time recovery: %+v", got)
		}
		// Again: nothing to create, and the store works.
		if out := e.ok("dev", "create-tables"); strings.Count(out, "exists") != 5 {
			t.Errorf("second dev create-tables printed %q, want five existing tables", out)
		}
		e.ok("org", "create", "--name", "After tables", "--id", "org_x")

		// Without a local endpoint it refuses: in AWS the tables come from template.yaml.
		aws := &testEnv{t: t, vars: map[string]string{"KILN_STORE": config.StoreDynamoDB}}
		code, _, stderr := aws.run("dev", "create-tables")
		if code != 1 || !strings.Contains(stderr, "KILN_DYNAMODB_ENDPOINT") {
			t.Errorf("dev create-tables without an endpoint: exit %d, stderr %q", code, stderr)
		}
		sqlite := newTestEnv(t)
		if code, _, stderr := sqlite.run("dev", "create-tables"); code != 1 || !strings.Contains(stderr, "KILN_STORE") {
			t.Errorf("dev create-tables on the embedded store: exit %d, stderr %q", code, stderr)
		}
	})

	storeVars = func(t *testing.T) map[string]string {
		v := vars()
		e := &testEnv{t: t, vars: v}
		var created json.RawMessage
		e.json(&created, "dev", "create-tables")
		return v
	}
	t.Cleanup(func() { storeVars = nil })
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"OperatorScenario", TestOperatorScenario},
		{"UsageRollsUp", TestUsageRollsUpExactlyOverInclusiveUTCDays},
		{"BadInputs", TestBadInputsFailClearlyAndChangeNothing},
	} {
		t.Run(tc.name, tc.test)
	}
}
