package dynamo_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/store/storetest"
)

// TestHotPathRoundTrips: with the key cache warm, a request costs the store exactly two round
// trips — one conditional UpdateItem to admit (no transaction, so that refusals never cancel
// settlements), one TransactWriteItems to settle — and a lease renewal one more.
func TestHotPathRoundTrips(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		var c calls
		s := srv.NewStore(t, c.option)
		mustCreateOrg(t, s, "org-a", 8, money.Dollar)
		for i := range 5 {
			gen := fmt.Sprintf("gen-%d", i)
			c.take()
			lease := mustAdmit(t, s, "org-a", gen, t0, 0)
			if ops := c.take(); ops["UpdateItem"] != 1 || total(ops) != 1 {
				t.Errorf("Admit made calls %v, want one UpdateItem", ops)
			}
			if _, err := s.Renew(t.Context(), lease, at(20*time.Second), 0); err != nil {
				t.Fatal(err)
			}
			if ops := c.take(); ops["UpdateItem"] != 1 || total(ops) != 1 {
				t.Errorf("Renew made calls %v, want one UpdateItem", ops)
			}
			if _, err := s.Settle(t.Context(), store.Settlement{Lease: lease, Event: testEvent("org-a", gen, 1_155), Now: at(30 * time.Second)}); err != nil {
				t.Fatal(err)
			}
			if ops := c.take(); ops["TransactWriteItems"] != 1 || total(ops) != 1 {
				t.Errorf("Settle made calls %v, want one TransactWriteItems", ops)
			}
		}
		// Refusals are decided in the same single round trip.
		if err := s.SetMaxInFlight(t.Context(), "org-a", 1); err != nil {
			t.Fatal(err)
		}
		mustAdmit(t, s, "org-a", "held", t0, 0)
		c.take()
		if _, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "refused", Now: t0}); err == nil {
			t.Fatal("Admit beyond the limit succeeded")
		}
		if ops := c.take(); total(ops) != 1 {
			t.Errorf("a refused Admit made calls %v, want one", ops)
		}
	})
}

// BenchmarkAdmitSettle measures the request path's store calls on each server, one request at a
// time: round trips per request (calls/op) and the latency of admission and settlement.
func BenchmarkAdmitSettle(b *testing.B) {
	for _, srv := range servers {
		b.Run(srv.Name, func(b *testing.B) {
			var c calls
			s := srv.NewStore(b, c.option)
			ctx := b.Context()
			if err := s.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", CreatedAt: t0}); err != nil {
				b.Fatal(err)
			}
			if err := s.AddEntry(ctx, store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp, Amount: 1000 * money.Dollar, At: t0}); err != nil {
				b.Fatal(err)
			}
			var admits, settles []time.Duration
			c.take()
			b.ResetTimer()
			for i := range b.N {
				gen := fmt.Sprintf("gen-%s-%09d", b.Name(), i)
				start := time.Now()
				lease, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: gen, Now: t0})
				if err != nil {
					b.Fatal(err)
				}
				admitted := time.Now()
				if _, err := s.Settle(ctx, store.Settlement{Lease: lease, Event: testEvent("org-a", gen, 1_155_000), Now: t0}); err != nil {
					b.Fatal(err)
				}
				admits, settles = append(admits, admitted.Sub(start)), append(settles, time.Since(admitted))
			}
			b.StopTimer()
			b.ReportMetric(float64(total(c.take()))/float64(b.N), "calls/op")
			storetest.ReportAdmitSettle(b, admits, settles)
		})
	}
}
