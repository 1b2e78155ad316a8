package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

func testAdmitErrors(t *testing.T, s store.Store) {
	createOrg(t, s, "org-new", 2, 0) // never topped up
	createOrg(t, s, "org-zero", 2, 5)
	addEntry(t, s, store.LedgerEntry{ID: "adj", OrgID: "org-zero", Kind: store.EntryAdjustment, Amount: -5, At: t0})
	createOrg(t, s, "org-negative", 2, 5)
	addEntry(t, s, store.LedgerEntry{ID: "adj", OrgID: "org-negative", Kind: store.EntryAdjustment, Amount: -6, At: t0})
	createOrg(t, s, "org-pico", 2, 1) // one picodollar is enough
	createOrg(t, s, "org-suspended", 2, money.Dollar)
	must(t, s.SetOrgStatus(ctx(t), "org-suspended", store.OrgSuspended))
	createOrg(t, s, "org-full", 2, money.Dollar)
	admit(t, s, "org-full", "held-1", t0)
	admit(t, s, "org-full", "held-2", t0)

	for _, tc := range []struct {
		org  string
		want error
		held []string // holders afterwards
	}{
		{"org-missing", store.ErrNotFound, nil},
		{"org-new", store.ErrInsufficientCredits, nil},
		{"org-zero", store.ErrInsufficientCredits, nil},
		{"org-negative", store.ErrInsufficientCredits, nil},
		{"org-pico", nil, []string{"gen-1"}},
		{"org-suspended", store.ErrSuspended, nil},
		{"org-full", store.ErrSlotsFull, []string{"held-1", "held-2"}},
	} {
		t.Run(tc.org, func(t *testing.T) {
			_, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: tc.org, HolderID: "gen-1", Now: at(time.Second)})
			wantErr(t, "Admit", err, tc.want)
			if tc.org != "org-missing" {
				wantHolders(t, s, tc.org, at(time.Second), tc.held...)
			}
		})
	}
}

// testAdmitPrecedence: a suspended organization is told so before it is told it has no credits,
// and that before it is told its slots are full.
func testAdmitPrecedence(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 1, 10)
	held := admit(t, s, "org-a", "held", t0)
	addEntry(t, s, store.LedgerEntry{ID: "drain", OrgID: "org-a", Kind: store.EntryAdjustment, Amount: -10, At: t0})
	must(t, s.SetOrgStatus(ctx(t), "org-a", store.OrgSuspended))
	try := func(want error, why string) {
		t.Helper()
		_, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-new", Now: at(time.Second)})
		wantErr(t, "Admit "+why, err, want)
	}
	try(store.ErrSuspended, "suspended, no credits, slots full")
	must(t, s.SetOrgStatus(ctx(t), "org-a", store.OrgActive))
	try(store.ErrInsufficientCredits, "active, no credits, slots full")
	addEntry(t, s, store.LedgerEntry{ID: "refill", OrgID: "org-a", Kind: store.EntryTopUp, Amount: 10, At: t0})
	try(store.ErrSlotsFull, "active, credits, slots full")
	settle(t, s, held, event("org-a", "held", 0, t0), at(time.Second))
	try(nil, "active, credits, a free slot")
	wantHolders(t, s, "org-a", at(time.Second), "gen-new")
}

func testAdmitLease(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, money.Dollar)
	createOrg(t, s, "org-b", 1, money.Dollar)
	l1 := admit(t, s, "org-a", "gen-1", t0)
	if want := (store.Lease{OrgID: "org-a", HolderID: "gen-1", Expires: t0.Add(store.DefaultLeaseTTL)}); !sameLease(l1, want) {
		t.Errorf("Admit with no TTL = %+v, want %+v", l1, want)
	}
	l2, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-2", Now: at(time.Second), TTL: 5 * time.Second})
	if want := (store.Lease{OrgID: "org-a", HolderID: "gen-2", Expires: at(6 * time.Second)}); err != nil || !sameLease(l2, want) {
		t.Errorf("Admit with a TTL = %+v, %v; want %+v", l2, err, want)
	}
	_, err = s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-3", Now: at(2 * time.Second)})
	wantErr(t, "Admit beyond the limit", err, store.ErrSlotsFull)

	leases := inFlight(t, s, "org-a", at(2*time.Second))
	byHolder := map[string]store.Lease{}
	for _, l := range leases {
		byHolder[l.HolderID] = l
	}
	if len(leases) != 2 || !sameLease(byHolder["gen-1"], l1) || !sameLease(byHolder["gen-2"], l2) {
		t.Errorf("InFlight = %+v, want %+v and %+v", leases, l1, l2)
	}
	// One organization's full slots leave another's alone.
	admit(t, s, "org-b", "gen-b", at(2*time.Second))
	wantHolders(t, s, "org-b", at(2*time.Second), "gen-b")
	wantHolders(t, s, "org-a", at(2*time.Second), "gen-1", "gen-2")
}

func testRenew(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 1, money.Dollar)
	l, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-1", Now: t0, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Renew(ctx(t), l, at(5*time.Second), 20*time.Second)
	if want := (store.Lease{OrgID: "org-a", HolderID: "gen-1", Expires: at(25 * time.Second)}); err != nil || !sameLease(r, want) {
		t.Fatalf("Renew = %+v, %v; want %+v", r, err, want)
	}
	// Past the original expiry the renewed lease still holds the only slot.
	wantHolders(t, s, "org-a", at(24*time.Second), "gen-1")
	_, err = s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-2", Now: at(24 * time.Second)})
	wantErr(t, "Admit while a renewed lease holds the slot", err, store.ErrSlotsFull)

	r, err = s.Renew(ctx(t), r, at(24*time.Second), 0)
	if want := (store.Lease{OrgID: "org-a", HolderID: "gen-1", Expires: at(24*time.Second + store.DefaultLeaseTTL)}); err != nil || !sameLease(r, want) {
		t.Errorf("Renew with no TTL = %+v, %v; want %+v", r, err, want)
	}

	// Once expired, a lease cannot be renewed, not even by its holder.
	expired := r.Expires
	_, err = s.Renew(ctx(t), r, expired, time.Minute)
	wantErr(t, "Renew at the expiry", err, store.ErrLeaseLost)
	wantHolders(t, s, "org-a", expired)

	// Once released, neither.
	l2 := admit(t, s, "org-a", "gen-2", expired)
	settle(t, s, l2, event("org-a", "gen-2", 1, expired), expired.Add(time.Second))
	_, err = s.Renew(ctx(t), l2, expired.Add(2*time.Second), time.Minute)
	wantErr(t, "Renew after release", err, store.ErrLeaseLost)
	wantHolders(t, s, "org-a", expired.Add(2*time.Second))

	_, err = s.Renew(ctx(t), store.Lease{OrgID: "org-a", HolderID: "gen-never"}, t0, time.Minute)
	wantErr(t, "Renew of an unknown lease", err, store.ErrLeaseLost)
}

// testLeaseExpiry: a holder that never releases its slot blocks nobody once its lease expires.
func testLeaseExpiry(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, money.Dollar)
	crashed, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "crashed", Now: t0, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	admit(t, s, "org-a", "alive", t0) // default TTL, outlives the crashed one
	_, err = s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-1", Now: crashed.Expires.Add(-time.Nanosecond)})
	wantErr(t, "Admit a nanosecond before the crashed holder's expiry", err, store.ErrSlotsFull)
	wantHolders(t, s, "org-a", crashed.Expires.Add(-time.Nanosecond), "crashed", "alive")
	wantHolders(t, s, "org-a", crashed.Expires, "alive")

	// At the expiry instant the slot is free.
	admit(t, s, "org-a", "gen-1", crashed.Expires)
	wantHolders(t, s, "org-a", crashed.Expires, "alive", "gen-1")
	_, err = s.Admit(ctx(t), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-2", Now: crashed.Expires})
	wantErr(t, "Admit with the freed slot taken again", err, store.ErrSlotsFull)

	// Much later everything has expired and the whole limit is available.
	later := at(time.Hour)
	wantHolders(t, s, "org-a", later)
	admit(t, s, "org-a", "gen-3", later)
	admit(t, s, "org-a", "gen-4", later)
	wantHolders(t, s, "org-a", later, "gen-3", "gen-4")
}

// RaceSlots hammers one organization with a limit of 3 from 32 goroutines, spread over the
// given stores (which must share their data, as two processes on one database do), and checks
// that no more than 3 requests ever held a slot at once. Each goroutine completes cycles
// acquire/release cycles (zero means 64, 2048 in all; fewer suit stores behind slow servers). It
// is part of Run; call it directly with several stores over the same data.
func RaceSlots(t *testing.T, cycles int, stores ...store.Store) {
	const (
		goroutines = 32
		limit      = 3
		cost       = money.Amount(1_155)
		org        = "org-race"
	)
	if cycles <= 0 {
		cycles = 64
	}
	initial := money.Dollar
	createOrg(t, stores[0], org, limit, initial)

	var (
		holding, most, refused atomic.Int64
		wg                     sync.WaitGroup
		failed                 = make(chan error, goroutines)
		// progress is when a cycle last completed: a goroutine refused for a while is fine (on
		// a slow server the others may keep the slots busy), nobody getting through is a leak.
		progress atomic.Int64
	)
	progress.Store(time.Now().UnixNano())
	stalled := func() time.Duration { return time.Since(time.Unix(0, progress.Load())) }
	for g := range goroutines {
		s := stores[g%len(stores)]
		wg.Go(func() {
			var backoff time.Duration
			for i := 0; i < cycles; {
				gen := generationID(t0, fmt.Sprintf("%02d-%04d", g, i))
				lease, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: org, HolderID: gen, Now: t0})
				if errors.Is(err, store.ErrSlotsFull) {
					refused.Add(1)
					if d := stalled(); d > 2*time.Minute {
						failed <- fmt.Errorf("Admit(%s): slots full, and no cycle completed for %v", gen, d)
						return
					}
					// Back off, as a client answered 429 would, so that holders get through to
					// Settle rather than queue behind hopeless retries.
					backoff = min(2*backoff+time.Duration(rand.IntN(50))*time.Microsecond, 16*time.Millisecond)
					time.Sleep(backoff)
					continue
				}
				if err != nil {
					failed <- fmt.Errorf("Admit(%s): %w", gen, err)
					return
				}
				backoff = 0
				n := holding.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				runtime.Gosched() // hold the slot while others try
				holding.Add(-1)
				res, err := s.Settle(ctx(t), store.Settlement{Lease: lease, Event: event(org, gen, cost, t0), Now: t0})
				if err != nil || res.AlreadyApplied {
					failed <- fmt.Errorf("Settle(%s) = %+v, %v", gen, res, err)
					return
				}
				progress.Store(time.Now().UnixNano())
				i++
			}
		})
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Error(err)
	}
	t.Logf("%d cycles, %d admissions refused for full slots, at most %d holders at once",
		goroutines*cycles, refused.Load(), most.Load())
	if m := most.Load(); m > limit || m < 1 {
		t.Errorf("at most %d holders observed at once, want 1 to %d", m, limit)
	}
	wantHolders(t, stores[0], org, t0)
	wantBalance(t, stores[len(stores)-1], org, initial-money.Amount(goroutines*cycles)*cost)
	events, err := stores[0].Usage(ctx(t), org, t0, t0.Add(time.Nanosecond))
	if err != nil || len(events) != goroutines*cycles {
		t.Errorf("Usage has %d events, %v; want %d", len(events), err, goroutines*cycles)
	}
}
