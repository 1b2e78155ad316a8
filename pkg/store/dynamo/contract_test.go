package dynamo_test

import (
	"testing"

	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/store/storetest"
)

// raceCycles sizes the slot races per server: each cycle is two transactions, and the refused
// admissions of 29 waiting goroutines come on top. DynamoDB Local answers about 500 conditional
// writes a second on this machine; moto, one request at a time, far fewer, and its transactions
// slow down as the usage and ledger tables grow (it copies them whole for each transaction).
type raceCycles struct {
	contract, fourClients int // per goroutine; 32 goroutines
}

func cyclesFor(srv *dynamotest.Server) raceCycles {
	if srv.Name == "moto" {
		return raceCycles{contract: 4, fourClients: 8}
	}
	return raceCycles{contract: 8, fourClients: 64}
}

// TestContract runs the whole contract suite on DynamoDB Local and on moto, each subtest on
// tables of its own.
func TestContract(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		storetest.Run(t, func(t *testing.T) store.Store { return srv.NewStore(t) },
			storetest.Options{RaceCycles: cyclesFor(srv).contract})
	})
}
