package dynamo_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

// TestSetUpLocalPointInTimeRecovery: SetUpLocal turns point-in-time recovery on where the server
// has it (moto) and reports false where it has none (DynamoDB Local), and a second run, on
// tables that have it already, reports the same.
func TestSetUpLocalPointInTimeRecovery(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		st := srv.NewStore(t)
		want := srv.Name == "moto"
		for run := range 2 {
			created, pitr, err := st.SetUpLocal(t.Context())
			if err != nil {
				t.Fatalf("run %d: SetUpLocal: %v", run, err)
			}
			if len(created) != 0 || pitr != want {
				t.Errorf("run %d: created %v, point-in-time recovery %v; want none created, %v", run, created, pitr, want)
			}
		}
		if !want {
			return
		}
		for _, table := range []string{st.Tables().Ledger, st.Tables().Usage, st.Tables().Aggregates} {
			if on, err := pitrOn(t, st, table); err != nil || !on {
				t.Errorf("%s: point-in-time recovery %v, %v; want on", table, on, err)
			}
		}
	})
}

// pitrOn reports whether the server says point-in-time recovery is on for table.
func pitrOn(t *testing.T, st *dynamo.Store, table string) (bool, error) {
	out, err := st.Client().DescribeContinuousBackups(t.Context(), &dynamodb.DescribeContinuousBackupsInput{TableName: aws.String(table)})
	if err != nil {
		return false, err
	}
	d := out.ContinuousBackupsDescription
	return d != nil && d.PointInTimeRecoveryDescription != nil &&
		d.PointInTimeRecoveryDescription.PointInTimeRecoveryStatus == types.PointInTimeRecoveryStatusEnabled, nil
}
