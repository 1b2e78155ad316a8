package dynamo_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
)

// TestSettleReplayDebitsOnce: the same settlement applied again, then eight times at once, leaves
// exactly one debit, one usage item and one balance change in the tables.
func TestSettleReplayDebitsOnce(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		s := srv.NewStore(t)
		mustCreateOrg(t, s, "org-a", 2, money.Dollar)
		lease := mustAdmit(t, s, "org-a", "gen-1", t0, 0)
		settlement := store.Settlement{Lease: lease, Event: testEvent("org-a", "gen-1", 1_155), Now: at(time.Second)}
		if res, err := s.Settle(t.Context(), settlement); err != nil || res.AlreadyApplied {
			t.Fatalf("first Settle = %+v, %v", res, err)
		}
		if res, err := s.Settle(t.Context(), settlement); err != nil || !res.AlreadyApplied {
			t.Fatalf("second Settle = %+v, %v; want AlreadyApplied", res, err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if res, err := s.Settle(t.Context(), settlement); err != nil || !res.AlreadyApplied {
					t.Errorf("concurrent replay = %+v, %v; want AlreadyApplied", res, err)
				}
			})
		}
		wg.Wait()

		// A second generation settled by eight callers at once: exactly one applies it.
		lease2 := mustAdmit(t, s, "org-a", "gen-2", t0, 0)
		second := store.Settlement{Lease: lease2, Event: testEvent("org-a", "gen-2", 2_000), Now: at(time.Second)}
		var (
			mu      sync.Mutex
			applied int
		)
		for range 8 {
			wg.Go(func() {
				res, err := s.Settle(t.Context(), second)
				if err != nil {
					t.Errorf("concurrent Settle: %v", err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if !res.AlreadyApplied {
					applied++
				}
			})
		}
		wg.Wait()
		if applied != 1 {
			t.Errorf("%d of 8 concurrent settlements applied, want 1", applied)
		}

		if o, err := s.Org(t.Context(), "org-a"); err != nil || o.Balance != money.Dollar-1_155-2_000 {
			t.Errorf("balance = %v, %v; want %v", o.Balance, err, money.Dollar-1_155-2_000)
		}
		ledger := rawItems(t, s, s.Tables().Ledger, "org-a")
		debits := 0
		for _, it := range ledger {
			if k, ok := it["kind"].(*types.AttributeValueMemberS); ok && k.Value == string(store.EntryDebit) {
				debits++
			}
		}
		if len(ledger) != 3 || debits != 2 {
			t.Errorf("ledger table has %d items for org-a, %d of them debits; want the top-up and 2 debits", len(ledger), debits)
		}
		if n := len(rawItems(t, s, s.Tables().Usage, "org-a")); n != 2 {
			t.Errorf("usage table has %d items for org-a, want 2", n)
		}
	})
}

// TestLostResponses: a transaction that committed but whose response was lost is retried by
// the SDK (DynamoDB Local answers the retry from its ClientRequestToken record; moto runs it
// again). Either way the caller learns that its settlement applied — not that it was a replay —
// and that it holds its lease, and the tables hold one debit and one lease.
func TestLostResponses(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		lose := &loseResponse{op: "UpdateItem"} // admission; settlement is a TransactWriteItems
		cfg := srv.Config()
		cfg.HTTPClient = lose
		s := srv.OpenStore(t, cfg)
		mustCreateOrg(t, s, "org-a", 1, money.Dollar)

		lose.armed.Store(true)
		lease, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-1", Now: t0})
		if err != nil {
			t.Fatalf("Admit whose first response was lost: %v", err)
		}
		if lose.lost.Load() != 1 {
			t.Fatal("no response was lost")
		}
		if leases := rawLeases(t, s, "org-a"); len(leases) != 1 {
			t.Errorf("lease map = %v, want just gen-1", leases)
		}

		lose.op = "TransactWriteItems"
		lose.armed.Store(true)
		res, err := s.Settle(t.Context(), store.Settlement{Lease: lease, Event: testEvent("org-a", "gen-1", 4_242), Now: at(time.Second)})
		if err != nil || res.AlreadyApplied {
			t.Fatalf("Settle whose first response was lost = %+v, %v; want applied", res, err)
		}
		if lose.lost.Load() != 2 {
			t.Fatal("no settlement response was lost")
		}
		if o, err := s.Org(t.Context(), "org-a"); err != nil || o.Balance != money.Dollar-4_242 {
			t.Errorf("balance = %v, %v; want %v", o.Balance, err, money.Dollar-4_242)
		}
		if n := len(rawItems(t, s, s.Tables().Ledger, "org-a")); n != 2 {
			t.Errorf("ledger has %d items, want the top-up and one debit", n)
		}
		if leases := rawLeases(t, s, "org-a"); len(leases) != 0 {
			t.Errorf("lease map after settlement = %v, want empty", leases)
		}
		// A true replay is still told apart.
		if res, err := s.Settle(t.Context(), store.Settlement{Lease: lease, Event: testEvent("org-a", "gen-1", 4_242), Now: at(2 * time.Second)}); err != nil || !res.AlreadyApplied {
			t.Errorf("replay = %+v, %v; want AlreadyApplied", res, err)
		}
	})
}

// TestSettleUnknownOrg: a settlement for an organization that does not exist writes nothing.
func TestSettleUnknownOrg(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		s := srv.NewStore(t)
		_, err := s.Settle(t.Context(), store.Settlement{Lease: store.Lease{OrgID: "org-x", HolderID: "gen-1"},
			Event: testEvent("org-x", "gen-1", 5), Now: t0})
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Settle for an unknown org: %v, want ErrNotFound", err)
		}
		if n := len(rawItems(t, s, s.Tables().Usage, "org-x")) + len(rawItems(t, s, s.Tables().Ledger, "org-x")); n != 0 {
			t.Errorf("%d items written for an unknown org", n)
		}
	})
}
