package storetest

import (
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

func admitReserving(t *testing.T, s store.Store, orgID, holder string, now time.Time, reserve money.Amount) (store.Lease, error) {
	t.Helper()
	return s.Admit(ctx(t), store.AdmitRequest{OrgID: orgID, HolderID: holder, Now: now, Reserve: reserve})
}

func wantCredits(t *testing.T, s store.Store, orgID string, balance, reserved money.Amount) {
	t.Helper()
	if o := org(t, s, orgID); o.Balance != balance || o.Reserved != reserved || o.Available() != balance-reserved {
		t.Errorf("%s: balance %s, reserved %s, available %s; want %s, %s, %s", orgID, o.Balance, o.Reserved, o.Available(), balance, reserved, balance-reserved)
	}
}

// testReservations: admission holds a request's worst-case cost from the balance until its
// settlement, which gives the reservation back and debits the exact cost; a request whose worst
// case does not fit what is available is refused with ErrInsufficientCredits, one that fits is
// admitted.
func testReservations(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 8, 100)
	l1, err := admitReserving(t, s, "org-a", "gen-1", t0, 60)
	if err != nil {
		t.Fatalf("Admit reserving 60 of 100: %v", err)
	}
	if l1.Reserved != 60 {
		t.Errorf("lease reserves %s, want 60", l1.Reserved)
	}
	wantCredits(t, s, "org-a", 100, 60)
	_, err = admitReserving(t, s, "org-a", "gen-2", t0, 41)
	wantErr(t, "Admit reserving 41 of 40", err, store.ErrInsufficientCredits)
	l2, err := admitReserving(t, s, "org-a", "gen-2", t0, 40)
	if err != nil {
		t.Fatalf("Admit reserving exactly what is available: %v", err)
	}
	wantCredits(t, s, "org-a", 100, 100)
	// Nothing left: even a request that reserves nothing is refused.
	_, err = admitReserving(t, s, "org-a", "gen-3", t0, 0)
	wantErr(t, "Admit with nothing available", err, store.ErrInsufficientCredits)
	wantHolders(t, s, "org-a", at(time.Second), "gen-1", "gen-2")

	settle(t, s, l1, event("org-a", "gen-1", 25, t0), at(time.Second))
	wantCredits(t, s, "org-a", 75, 40)
	settle(t, s, l2, event("org-a", "gen-2", 40, t0), at(time.Second))
	wantCredits(t, s, "org-a", 35, 0)
	wantHolders(t, s, "org-a", at(time.Second))

	// A replay changes nothing, reservations included.
	if res := settle(t, s, l1, event("org-a", "gen-1", 25, t0), at(2*time.Second)); !res.AlreadyApplied {
		t.Error("a replayed settlement was applied again")
	}
	wantCredits(t, s, "org-a", 35, 0)
	if _, err := admitReserving(t, s, "org-a", "gen-4", at(2*time.Second), 35); err != nil {
		t.Errorf("Admit reserving all that is available after a replay: %v", err)
	}
}

// testExpiredReservation: a lease that expired gives its reservation back to the next admission
// that needs it, and its late settlement debits only what is then available.
func testExpiredReservation(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 8, 100)
	l, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-lapsed", Now: t0, TTL: 10 * time.Second, Reserve: 100})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admitReserving(t, s, "org-a", "gen-early", at(5*time.Second), 1)
	wantErr(t, "Admit while the balance is reserved", err, store.ErrInsufficientCredits)
	l2, err := admitReserving(t, s, "org-a", "gen-next", at(11*time.Second), 70)
	if err != nil {
		t.Fatalf("Admit after the reserving lease expired: %v", err)
	}
	wantHolders(t, s, "org-a", at(11*time.Second), "gen-next")
	// The lapsed holder settles late, for 50: only 30 is available beside gen-next's 70.
	res := settle(t, s, l, event("org-a", "gen-lapsed", 50, t0), at(12*time.Second))
	if res.WrittenOff != 20 {
		t.Errorf("late settlement wrote off %s, want 20", res.WrittenOff)
	}
	if e, err := s.Generation(ctx(t), "org-a", "gen-lapsed"); err != nil || e.Cost != 30 || !e.Estimated {
		t.Errorf("late settlement's record: %+v, %v; want cost 30, estimated", e, err)
	}
	wantCredits(t, s, "org-a", 70, 70)
	settle(t, s, l2, event("org-a", "gen-next", 70, t0), at(13*time.Second))
	wantCredits(t, s, "org-a", 0, 0)
}

// testBalanceNeverNegative: no settlement takes a balance below zero. A cost beyond the request's
// reservation is taken from what is available and capped there; the record carries the debited
// cost, the rest is reported written off.
func testBalanceNeverNegative(t *testing.T, s store.Store) {
	const micro = money.Amount(1_000_000)
	createOrg(t, s, "org-a", 4, micro)
	l1 := admit(t, s, "org-a", "gen-1", t0) // reserving nothing
	l2 := admit(t, s, "org-a", "gen-2", t0)
	if res := settle(t, s, l1, event("org-a", "gen-1", micro+1, t0), at(time.Second)); res.WrittenOff != 1 {
		t.Errorf("gen-1 wrote off %s, want 0.000000000001", res.WrittenOff)
	}
	wantBalance(t, s, "org-a", 0)
	if res := settle(t, s, l2, event("org-a", "gen-2", 3*micro, t0), at(2*time.Second)); res.WrittenOff != 3*micro {
		t.Errorf("gen-2 wrote off %s, want %s", res.WrittenOff, 3*micro)
	}
	wantBalance(t, s, "org-a", 0)
	_, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-3", Now: at(3 * time.Second)})
	wantErr(t, "Admit with a zero balance", err, store.ErrInsufficientCredits)
	wantHolders(t, s, "org-a", at(3*time.Second))
	var debits money.Amount
	for _, e := range ledger(t, s, "org-a") {
		if e.Kind == store.EntryDebit {
			debits -= e.Amount
		}
	}
	if debits != micro {
		t.Errorf("debits sum to %s, want %s", debits, micro)
	}
}

func ledger(t *testing.T, s store.Store, orgID string) []store.LedgerEntry {
	t.Helper()
	entries, err := s.Ledger(ctx(t), orgID)
	if err != nil {
		t.Fatalf("Ledger(%s): %v", orgID, err)
	}
	return entries
}
