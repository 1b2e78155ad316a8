package storetest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

func testSettle(t *testing.T, s store.Store) {
	initial := mustParse(t, "1.5")
	createOrg(t, s, "org-a", 1, initial)
	gen := generationID(at(-time.Second), "1")
	lease := admit(t, s, "org-a", gen, t0)
	e := event("org-a", gen, mustParse(t, "0.000001155"), at(-time.Second))
	if res := settle(t, s, lease, e, at(2*time.Second)); res.AlreadyApplied {
		t.Error("first Settle reports AlreadyApplied")
	}
	wantBalance(t, s, "org-a", initial-e.Cost)
	// The slot is free again.
	wantHolders(t, s, "org-a", at(2*time.Second))
	admit(t, s, "org-a", "gen-2", at(2*time.Second))

	wantGeneration(t, s, e)
	entries := ledger(t, s, "org-a")
	debit := store.LedgerEntry{ID: gen, OrgID: "org-a", Kind: store.EntryDebit, Amount: -e.Cost, At: at(2 * time.Second)}
	if len(entries) != 2 || entries[0].ID != "initial" || !sameEntry(withoutNote(entries[1]), debit) {
		t.Errorf("Ledger = %+v, want the initial top-up and %+v", entries, debit)
	}
	events, err := s.Usage(ctx(t), "org-a", at(-time.Hour), at(time.Hour))
	if err != nil || len(events) != 1 || !sameEvent(events[0], e) {
		t.Errorf("Usage = %+v, %v; want just %+v", events, err, e)
	}
}

func withoutNote(e store.LedgerEntry) store.LedgerEntry {
	e.Note = ""
	return e
}

// snapshot is everything a settlement may change.
type snapshot struct {
	balance money.Amount
	ledger  []store.LedgerEntry
	usage   []usage.Event
}

func snap(t *testing.T, s store.Store, orgID string) snapshot {
	t.Helper()
	events, err := s.Usage(ctx(t), orgID, at(-24*time.Hour), at(24*time.Hour))
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	return snapshot{org(t, s, orgID).Balance, ledger(t, s, orgID), events}
}

func (a snapshot) equal(b snapshot) bool {
	return a.balance == b.balance && slices.EqualFunc(a.ledger, b.ledger, sameEntry) &&
		slices.EqualFunc(a.usage, b.usage, sameEvent)
}

func testSettleReplay(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, money.Dollar)
	gen := generationID(t0, "1")
	lease := admit(t, s, "org-a", gen, t0)
	e := event("org-a", gen, 777, t0)
	settle(t, s, lease, e, at(time.Second))
	before := snap(t, s, "org-a")

	// The same generation again, as a retry would send it, and with a different cost.
	other := e
	other.Cost, other.CompletionTokens, other.Status = 999_999, 9, usage.StatusCompleted
	for i, replay := range []usage.Event{e, other} {
		res := settle(t, s, lease, replay, at(time.Duration(2+i)*time.Second))
		if !res.AlreadyApplied {
			t.Errorf("replay %d: AlreadyApplied = false", i)
		}
		if after := snap(t, s, "org-a"); !after.equal(before) {
			t.Errorf("replay %d changed the store:\n got %+v\nwant %+v", i, after, before)
		}
	}
	wantGeneration(t, s, e)
	wantBalance(t, s, "org-a", money.Dollar-777)
}

func testSettleConcurrent(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, money.Dollar)
	gen := generationID(t0, "1")
	lease := admit(t, s, "org-a", gen, t0)
	e := event("org-a", gen, 12345, t0)
	const n = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int
	)
	for range n {
		wg.Go(func() {
			res, err := s.Settle(ctx(t), store.Settlement{Lease: lease, Event: e, Now: at(time.Second)})
			if err != nil {
				t.Errorf("Settle: %v", err)
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
		t.Errorf("%d of %d concurrent settlements applied, want exactly 1", applied, n)
	}
	wantBalance(t, s, "org-a", money.Dollar-12345)
	got := snap(t, s, "org-a")
	if len(got.ledger) != 2 || len(got.usage) != 1 {
		t.Errorf("after concurrent settlements: %d ledger entries, %d events; want 2 and 1", len(got.ledger), len(got.usage))
	}
	wantHolders(t, s, "org-a", at(time.Second))
}

// testSettleExpiredLease: a lease lost to expiry does not lose the money.
func testSettleExpiredLease(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 1, money.Dollar)
	lease, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-1", Now: t0, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Another request takes the expired slot before the slow one settles.
	admit(t, s, "org-a", "gen-2", at(time.Minute))
	e := event("org-a", "gen-1", 500, t0)
	if res := settle(t, s, lease, e, at(90*time.Second)); res.AlreadyApplied {
		t.Error("Settle of an expired lease reports AlreadyApplied")
	}
	wantBalance(t, s, "org-a", money.Dollar-500)
	wantGeneration(t, s, e)
	// The late settlement releases nobody else's slot.
	wantHolders(t, s, "org-a", at(90*time.Second), "gen-2")
}

// testSettleZeroCost: a request that cost nothing (an error) is still recorded, once.
func testSettleZeroCost(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 1, money.Dollar)
	lease := admit(t, s, "org-a", "gen-1", t0)
	e := event("org-a", "gen-1", 0, t0)
	e.Status, e.HTTPStatus, e.PromptTokens, e.CachedTokens, e.CompletionTokens = usage.StatusUpstreamError, 502, 0, 0, 0
	if res := settle(t, s, lease, e, at(time.Second)); res.AlreadyApplied {
		t.Error("first Settle reports AlreadyApplied")
	}
	wantBalance(t, s, "org-a", money.Dollar)
	wantHolders(t, s, "org-a", at(time.Second))
	wantGeneration(t, s, e)
	if res := settle(t, s, lease, e, at(2*time.Second)); !res.AlreadyApplied {
		t.Error("replay of a zero-cost settlement: AlreadyApplied = false")
	}
}

func testGeneration(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 1, money.Dollar)
	createOrg(t, s, "org-b", 1, money.Dollar)
	lease := admit(t, s, "org-a", "gen-1", t0)
	e := event("org-a", "gen-1", 42, t0)
	settle(t, s, lease, e, at(time.Second))

	wantGeneration(t, s, e)
	_, err := s.Generation(ctx(t), "org-b", "gen-1")
	wantErr(t, "Generation of another organization's id", err, store.ErrNotFound)
	_, err = s.Generation(ctx(t), "org-a", "gen-unknown")
	wantErr(t, "Generation of an unknown id", err, store.ErrNotFound)

	// A settlement for an organization that does not exist records nothing.
	ghost := event("org-missing", "gen-ghost", 42, t0)
	if _, err := s.Settle(ctx(t), store.Settlement{Lease: store.Lease{OrgID: "org-missing", HolderID: "gen-ghost"},
		Event: ghost, Now: at(time.Second)}); err == nil {
		t.Error("Settle for an unknown organization succeeded")
	}
	_, err = s.Generation(ctx(t), "org-missing", "gen-ghost")
	wantErr(t, "Generation of a refused settlement", err, store.ErrNotFound)
	wantBalance(t, s, "org-b", money.Dollar)
}

func testUsage(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 8, money.Dollar)
	createOrg(t, s, "org-b", 8, money.Dollar)
	from, to := at(time.Second), at(3*time.Second)
	ids := map[string]string{} // name → generation id
	for _, tc := range []struct {
		org, gen string
		started  time.Time
	}{
		{"org-a", "f", to}, // excluded: the range ends before to
		{"org-a", "e", at(2 * time.Second)},
		{"org-a", "b", from},                       // included: the range starts at from
		{"org-a", "a", from},                       // same start: by generation id
		{"org-a", "0", from.Add(-time.Nanosecond)}, // excluded, though of from's millisecond
		{"org-a", "c", to.Add(-time.Nanosecond)},   // included, of to's millisecond
		{"org-b", "d", at(2 * time.Second)},        // another organization's
		{"org-a", "g", at(1500 * time.Millisecond)},
		{"org-a", "h", at(2*time.Second + time.Hour)}, // excluded
	} {
		gen := generationID(tc.started, tc.gen)
		ids[tc.gen] = gen
		lease := admit(t, s, tc.org, gen, t0)
		settle(t, s, lease, event(tc.org, gen, 1, tc.started), at(time.Hour))
	}
	events, err := s.Usage(ctx(t), "org-a", from, to)
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	if got, want := generationIDs(events), []string{ids["a"], ids["b"], ids["g"], ids["e"], ids["c"]}; !slices.Equal(got, want) {
		t.Errorf("Usage(org-a, [%v, %v)) = %v, want %v", from, to, got, want)
	}
	for _, e := range events {
		if e.OrgID != "org-a" {
			t.Errorf("Usage(org-a) returned an event of %s", e.OrgID)
		}
	}
	if events, err := s.Usage(ctx(t), "org-a", to, to); err != nil || len(events) != 0 {
		t.Errorf("Usage over an empty range = %v, %v; want none", generationIDs(events), err)
	}
}
