package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

func mustParse(t *testing.T, s string) money.Amount {
	t.Helper()
	a, err := money.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func testEntries(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, 0)
	createOrg(t, s, "org-b", 2, 0)
	wantBalance(t, s, "org-a", 0)

	topUp := store.LedgerEntry{ID: "top-1", OrgID: "org-a", Kind: store.EntryTopUp,
		Amount: mustParse(t, "10.000000000001"), Note: "invoice 17", At: at(time.Minute)}
	addEntry(t, s, topUp)
	wantBalance(t, s, "org-a", topUp.Amount)

	// The same ID again changes nothing, whatever its amount.
	again := topUp
	again.Amount = mustParse(t, "99")
	wantErr(t, "AddEntry with a taken ID", s.AddEntry(ctx(t), again), store.ErrExists)
	wantBalance(t, s, "org-a", topUp.Amount)

	adjust := store.LedgerEntry{ID: "adj-1", OrgID: "org-a", Kind: store.EntryAdjustment,
		Amount: mustParse(t, "-2.5"), Note: "goodwill reversal", At: at(2 * time.Minute)}
	addEntry(t, s, adjust)
	wantBalance(t, s, "org-a", mustParse(t, "7.500000000001"))

	// Debits come only from settlements.
	debit := store.LedgerEntry{ID: "gen-x", OrgID: "org-a", Kind: store.EntryDebit, Amount: -1, At: at(3 * time.Minute)}
	if err := s.AddEntry(ctx(t), debit); err == nil {
		t.Error("AddEntry of a debit succeeded")
	}
	err := s.AddEntry(ctx(t), store.LedgerEntry{ID: "top-1", OrgID: "org-missing", Kind: store.EntryTopUp, Amount: 1, At: t0})
	wantErr(t, "AddEntry for an unknown org", err, store.ErrNotFound)
	wantBalance(t, s, "org-a", mustParse(t, "7.500000000001"))

	got := ledger(t, s, "org-a")
	if want := []store.LedgerEntry{topUp, adjust}; !slices.EqualFunc(got, want, sameEntry) {
		t.Errorf("Ledger(org-a) = %+v, want %+v", got, want)
	}
	wantBalance(t, s, "org-b", 0)
	if got, err := s.Ledger(ctx(t), "org-b"); err != nil || len(got) != 0 {
		t.Errorf("Ledger(org-b) = %+v, %v; want empty", got, err)
	}
}

func testLedgerOrder(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, 0)
	for _, e := range []struct {
		id string
		at time.Duration
	}{{"e", 3 * time.Second}, {"b", time.Second}, {"d", 2 * time.Second}, {"a", 2 * time.Second}, {"c", 0}} {
		addEntry(t, s, store.LedgerEntry{ID: e.id, OrgID: "org-a", Kind: store.EntryTopUp, Amount: 1, At: at(e.at)})
	}
	// A settlement's debit takes its place among the entries by the settlement's time.
	l := admit(t, s, "org-a", "gen-1", at(2*time.Second))
	settle(t, s, l, event("org-a", "gen-1", 2, at(2*time.Second)), at(2500*time.Millisecond))

	entries := ledger(t, s, "org-a")
	if got, want := entryIDs(entries), []string{"c", "b", "a", "d", "gen-1", "e"}; !slices.Equal(got, want) {
		t.Errorf("Ledger order = %v, want %v (by time, then id)", got, want)
	}
	for _, e := range entries {
		if e.ID == "gen-1" && (e.Kind != store.EntryDebit || e.Amount != -2 || !e.At.Equal(at(2500*time.Millisecond))) {
			t.Errorf("debit entry = %+v, want kind debit, amount -2, at %v", e, at(2500*time.Millisecond))
		}
	}
	wantBalance(t, s, "org-a", 3)
}

// testMoneyExact adds many odd amounts, some above 2^53 picodollars where a float64 loses
// whole picodollars, and expects the exact integer sum.
func testMoneyExact(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, 0)
	amounts := []money.Amount{
		mustParse(t, "0.1"), mustParse(t, "0.000000000001"), mustParse(t, "0.333333333333"),
		mustParse(t, "9007.199254740993"), mustParse(t, "123.456789012345"), mustParse(t, "0.7"),
	}
	var want money.Amount
	n := 300
	for i := range n {
		a := amounts[i%len(amounts)] + money.Amount(i)
		kind := store.EntryTopUp
		if i%7 == 3 {
			kind, a = store.EntryAdjustment, -a/3
		}
		addEntry(t, s, store.LedgerEntry{ID: fmt.Sprintf("e-%03d", i),
			OrgID: "org-a", Kind: kind, Amount: a, At: at(time.Duration(i) * time.Millisecond)})
		want += a
	}
	if want%2 == 0 {
		addEntry(t, s, store.LedgerEntry{ID: "e-odd", OrgID: "org-a", Kind: store.EntryTopUp, Amount: 1, At: t0})
		want++
		n++
	}
	if want <= 1<<53 {
		t.Fatalf("test amounts sum to %d; the test needs an odd sum above 2^53", want)
	}
	wantBalance(t, s, "org-a", want)
	entries := ledger(t, s, "org-a")
	var sum money.Amount
	for _, e := range entries {
		sum += e.Amount
	}
	if len(entries) != n || sum != want {
		t.Errorf("Ledger has %d entries summing to %s, want %d summing to %s", len(entries), sum, n, want)
	}
}
