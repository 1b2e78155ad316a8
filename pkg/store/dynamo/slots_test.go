package dynamo_test

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo/dynamotest"
	"github.com/neocloud/kiln/pkg/store/storetest"
)

// TestSlotsRaceFourClients runs the contract's slot race through four separate store clients on
// the same tables, as four gateway instances would, while a fifth client reads the lease map
// from the table the whole time: neither the holders' own count nor the table ever shows more
// than the limit of 3 unexpired holders, and no lease is left behind, expired or not.
func TestSlotsRaceFourClients(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		cfg := srv.Config()
		clients := make([]store.Store, 4)
		for i := range clients {
			clients[i] = srv.OpenStore(t, cfg)
		}
		watcher := srv.OpenStore(t, cfg)

		var (
			done         = make(chan struct{})
			wg           sync.WaitGroup
			most, reads  int
			watchErr     error
			watchedLimit = 3
		)
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				leases, err := watcher.InFlight(t.Context(), "org-race", t0)
				if errors.Is(err, store.ErrNotFound) {
					continue // the race has not created its organization yet
				}
				if err != nil {
					watchErr = err
					return
				}
				reads++
				most = max(most, len(leases))
				time.Sleep(time.Millisecond)
			}
		})
		storetest.RaceSlots(t, cyclesFor(srv).fourClients, clients...)
		close(done)
		wg.Wait()
		if watchErr != nil {
			t.Fatalf("reading the lease map during the race: %v", watchErr)
		}
		t.Logf("the table, read %d times during the race, showed at most %d holders", reads, most)
		if most > watchedLimit {
			t.Errorf("the table showed %d unexpired holders at once, limit %d", most, watchedLimit)
		}
		if reads == 0 {
			t.Error("the lease map was never read during the race")
		}
		if left := rawLeases(t, watcher, "org-race"); len(left) != 0 {
			t.Errorf("leases left behind after the race: %v", left)
		}
	})
}

// TestCrashedHolderBlocksNobody: holders that never release (their gateway died) fill an
// organization's lease map; once their leases expire, by the clock passed in, the next admission
// clears them out and takes a slot, and a crashed holder's late settlement still bills without
// touching anyone else's lease.
func TestCrashedHolderBlocksNobody(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		var c calls
		s := srv.NewStore(t, c.option)
		mustCreateOrg(t, s, "org-a", 2, money.Dollar)
		crashed := mustAdmit(t, s, "org-a", "crashed-1", t0, 10*time.Second)
		mustAdmit(t, s, "org-a", "crashed-2", at(time.Second), 10*time.Second)

		_, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-early", Now: at(10*time.Second - time.Nanosecond)})
		if !errors.Is(err, store.ErrSlotsFull) {
			t.Fatalf("Admit while both crashed leases are unexpired: %v, want ErrSlotsFull", err)
		}

		// At 11 s both crashed leases have expired (one exactly at that instant).
		c.take()
		l1 := mustAdmit(t, s, "org-a", "gen-1", at(11*time.Second), 0)
		if ops := c.take(); ops["UpdateItem"] != 3 || total(ops) != 3 {
			t.Errorf("admission over expired leases made calls %v, want 2 admission updates and 1 purge", ops)
		}
		if got := slices.Sorted(maps.Keys(rawLeases(t, s, "org-a"))); !slices.Equal(got, []string{"gen-1"}) {
			t.Errorf("lease map after the purge = %v, want just gen-1", got)
		}
		c.take()
		mustAdmit(t, s, "org-a", "gen-2", at(11*time.Second), 0)
		if ops := c.take(); total(ops) != 1 {
			t.Errorf("admission into a clean map made calls %v, want 1", ops)
		}
		_, err = s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-3", Now: at(12 * time.Second)})
		if !errors.Is(err, store.ErrSlotsFull) {
			t.Errorf("Admit beyond the limit after the purge: %v, want ErrSlotsFull", err)
		}
		if _, err := s.Renew(t.Context(), crashed, at(12*time.Second), time.Minute); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Renew of a purged lease: %v, want ErrLeaseLost", err)
		}

		// The crashed holder's gateway comes back and settles: billed, nobody released.
		if res, err := s.Settle(t.Context(), store.Settlement{Lease: crashed, Event: testEvent("org-a", "crashed-1", 700), Now: at(13 * time.Second)}); err != nil || res.AlreadyApplied {
			t.Fatalf("late Settle of a crashed holder = %+v, %v", res, err)
		}
		if got := slices.Sorted(maps.Keys(rawLeases(t, s, "org-a"))); !slices.Equal(got, []string{"gen-1", "gen-2"}) {
			t.Errorf("lease map after a late settlement = %v, want gen-1 and gen-2", got)
		}
		if o, err := s.Org(t.Context(), "org-a"); err != nil || o.Balance != money.Dollar-700 {
			t.Errorf("balance after the late settlement = %v, %v; want %v", o.Balance, err, money.Dollar-700)
		}
		if _, err := s.Settle(t.Context(), store.Settlement{Lease: l1, Event: testEvent("org-a", "gen-1", 1), Now: at(14 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(maps.Keys(rawLeases(t, s, "org-a"))); !slices.Equal(got, []string{"gen-2"}) {
			t.Errorf("lease map after gen-1 settled = %v, want gen-2", got)
		}
	})
}

// TestLoweredLimit: a lowered limit refuses new holders until those above it have left.
func TestLoweredLimit(t *testing.T) {
	eachServer(t, func(t *testing.T, srv *dynamotest.Server) {
		s := srv.NewStore(t)
		mustCreateOrg(t, s, "org-a", 3, money.Dollar)
		leases := []store.Lease{mustAdmit(t, s, "org-a", "gen-1", t0, 0), mustAdmit(t, s, "org-a", "gen-2", t0, 0), mustAdmit(t, s, "org-a", "gen-3", t0, 0)}
		if err := s.SetMaxInFlight(t.Context(), "org-a", 1); err != nil {
			t.Fatal(err)
		}
		for i, l := range leases {
			if i < 2 {
				if _, err := s.Settle(t.Context(), store.Settlement{Lease: l, Event: testEvent("org-a", l.HolderID, 1), Now: t0}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-new", Now: t0})
			if !errors.Is(err, store.ErrSlotsFull) {
				t.Fatalf("Admit with %d holders and a limit of 1: %v, want ErrSlotsFull", 3-min(i+1, 2), err)
			}
		}
		if _, err := s.Settle(t.Context(), store.Settlement{Lease: leases[2], Event: testEvent("org-a", "gen-3", 1), Now: t0}); err != nil {
			t.Fatal(err)
		}
		mustAdmit(t, s, "org-a", "gen-new", t0, 0)
	})
}
