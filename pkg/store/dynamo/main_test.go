package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

// servers are the local DynamoDB servers every test here runs against: Amazon DynamoDB Local
// and moto, started once for the package.
var servers []*dynamotest.Server

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var (
		wg       sync.WaitGroup
		ddb, mot *dynamotest.Server
		errDDB   error
		errMoto  error
	)
	wg.Go(func() { ddb, errDDB = dynamotest.StartDynamoDBLocal(ctx) })
	wg.Go(func() { mot, errMoto = dynamotest.StartMoto(ctx) })
	wg.Wait()
	cancel()
	if errDDB != nil || errMoto != nil {
		for _, err := range []error{errDDB, errMoto} {
			if err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: cannot start a local DynamoDB server for the tests: %v\n", err)
			}
		}
		for _, s := range []*dynamotest.Server{ddb, mot} {
			if s != nil {
				s.Stop()
			}
		}
		os.Exit(1)
	}
	servers = []*dynamotest.Server{ddb, mot}
	code := m.Run()
	for _, s := range servers {
		s.Stop()
	}
	os.Exit(code)
}

// eachServer runs test once per server, as a subtest named after it.
func eachServer(t *testing.T, test func(t *testing.T, srv *dynamotest.Server)) {
	for _, srv := range servers {
		t.Run(srv.Name, func(t *testing.T) { test(t, srv) })
	}
}
