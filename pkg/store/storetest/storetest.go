// Package storetest is the contract every store.Store implementation must pass: one suite, run
// against the SQLite store and the DynamoDB store alike. Times are passed in, so lease expiry is
// tested by moving a clock, never by sleeping.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Options size the suite for stores behind slow servers (local emulators).
type Options struct {
	// RaceCycles is the number of acquire/release cycles each of the slot race's 32 goroutines
	// completes; zero means 64 (2048 in all).
	RaceCycles int
	// FoldsAtSettlement: the store folds every settled event into its aggregates in the
	// settlement itself (the embedded store), which a test of its own checks.
	FoldsAtSettlement bool
}

// Run runs the contract suite, sized by opt. open must return a fresh, empty store for each
// subtest; Run closes it when the subtest ends. Subtests run in parallel.
func Run(t *testing.T, open func(t *testing.T) store.Store, opt Options) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, s store.Store)
	}{
		{"OrgsCreateAndList", testOrgs},
		{"OrgStatusAndLimit", testOrgStatusAndLimit},
		{"KeysCreateAndList", testKeys},
		{"Authenticate", testAuthenticate},
		{"Maintenance", testMaintenance},
		{"LedgerEntries", testEntries},
		{"LedgerOrder", testLedgerOrder},
		{"MoneyExact", testMoneyExact},
		{"AdmitErrors", testAdmitErrors},
		{"AdmitPrecedence", testAdmitPrecedence},
		{"AdmitLease", testAdmitLease},
		{"Renew", testRenew},
		{"LeaseExpiry", testLeaseExpiry},
		{"Settle", testSettle},
		{"SettleReplay", testSettleReplay},
		{"SettleConcurrent", testSettleConcurrent},
		{"SettleExpiredLease", testSettleExpiredLease},
		{"SettleZeroCost", testSettleZeroCost},
		{"Reservations", testReservations},
		{"ExpiredReservation", testExpiredReservation},
		{"BalanceNeverNegative", testBalanceNeverNegative},
		{"Generation", testGeneration},
		{"Usage", testUsage},
		{"FoldAtSettlement", testFoldAtSettlement},
		{"Aggregates", testAggregates},
		{"SlotsRace", func(t *testing.T, s store.Store) { RaceSlots(t, opt.RaceCycles, s) }},
	} {
		if !opt.FoldsAtSettlement && tc.name == "FoldAtSettlement" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.test(t, s)
		})
	}
}

// t0 is the suite's clock origin; tests move time forward from it. The odd nanoseconds check that
// times are kept exactly.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// generationID is the id the gateway gives a request that started at started: "gen-" and a ULID
// of that millisecond, here with name (at most 10 bytes) as its random part, so that the ids of
// one millisecond sort by name. Stores may find a usage event by the time in its id (the DynamoDB
// store lists usage by start time so), so events that a test lists carry such ids.
func generationID(started time.Time, name string) string {
	var u ulid.ULID
	if err := u.SetTime(ulid.Timestamp(started)); err != nil || len(name) > len(u)-6 {
		panic(fmt.Sprintf("generationID(%v, %q)", started, name))
	}
	copy(u[6:], name)
	return "gen-" + u.String()
}

func ctx(t *testing.T) context.Context { return t.Context() }

// createOrg creates an active organization with the given limit and balance.
func createOrg(t *testing.T, s store.Store, id string, limit int, balance money.Amount) {
	t.Helper()
	if err := s.CreateOrg(ctx(t), store.Org{ID: id, Name: "Org " + id, Status: store.OrgActive,
		MaxInFlight: limit, CreatedAt: t0}); err != nil {
		t.Fatalf("CreateOrg(%s): %v", id, err)
	}
	if balance != 0 {
		addEntry(t, s, store.LedgerEntry{ID: "initial", OrgID: id, Kind: store.EntryTopUp, Amount: balance, At: t0})
	}
}

func addEntry(t *testing.T, s store.Store, e store.LedgerEntry) {
	t.Helper()
	if err := s.AddEntry(ctx(t), e); err != nil {
		t.Fatalf("AddEntry(%+v): %v", e, err)
	}
}

func org(t *testing.T, s store.Store, orgID string) store.Org {
	t.Helper()
	o, err := s.Org(ctx(t), orgID)
	if err != nil {
		t.Fatalf("Org(%s): %v", orgID, err)
	}
	return o
}

func wantBalance(t *testing.T, s store.Store, orgID string, want money.Amount) {
	t.Helper()
	if got := org(t, s, orgID).Balance; got != want {
		t.Errorf("balance of %s = %s, want %s", orgID, got, want)
	}
}

// must stops the test on an error of a call the test needs to go on.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails unless err matches target (errors.Is; a nil target matches only a nil err).
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: error %v, want %v", what, err, target)
	}
}

func admit(t *testing.T, s store.Store, orgID, holder string, now time.Time) store.Lease {
	t.Helper()
	l, err := s.Admit(ctx(t), store.AdmitRequest{OrgID: orgID, HolderID: holder, Now: now})
	if err != nil {
		t.Fatalf("Admit(%s, %s): %v", orgID, holder, err)
	}
	return l
}

func inFlight(t *testing.T, s store.Store, orgID string, now time.Time) []store.Lease {
	t.Helper()
	leases, err := s.InFlight(ctx(t), orgID, now)
	if err != nil {
		t.Fatalf("InFlight(%s): %v", orgID, err)
	}
	return leases
}

// wantHolders fails unless exactly these holders (in any order) hold slots at now.
func wantHolders(t *testing.T, s store.Store, orgID string, now time.Time, holders ...string) {
	t.Helper()
	leases := inFlight(t, s, orgID, now)
	var got []string
	for _, l := range leases {
		if l.OrgID != orgID {
			t.Errorf("InFlight(%s) lists a lease of %s", orgID, l.OrgID)
		}
		got = append(got, l.HolderID)
	}
	slices.Sort(got)
	if !slices.Equal(got, slices.Sorted(slices.Values(holders))) {
		t.Errorf("InFlight(%s) at %v = %v, want holders %v", orgID, now, leases, holders)
	}
}

// event is a usage event with every field set to a non-zero value, so a store that drops or
// mixes up a column is caught.
func event(orgID, generationID string, cost money.Amount, started time.Time) usage.Event {
	return usage.Event{
		Version:          usage.SchemaVersion,
		GenerationID:     generationID,
		OrgID:            orgID,
		KeyID:            "kiln-AbC123xY",
		Model:            "qwen3-32b",
		Endpoint:         "/v1/chat/completions",
		Stream:           true,
		Status:           usage.StatusClientDisconnected,
		HTTPStatus:       200,
		FinishReason:     "length",
		PromptTokens:     1234,
		CachedTokens:     1000,
		CompletionTokens: 567,
		Cost:             cost,
		Estimated:        true,
		StartedAt:        started,
		TTFTMillis:       321,
		DurationMillis:   4321,
		Backend:          "vllm-a",
	}
}

func settle(t *testing.T, s store.Store, lease store.Lease, e usage.Event, now time.Time) store.SettleResult {
	t.Helper()
	res, err := s.Settle(ctx(t), store.Settlement{Lease: lease, Event: e, Now: now})
	if err != nil {
		t.Fatalf("Settle(%s): %v", e.GenerationID, err)
	}
	return res
}

// wantGeneration fails unless the store records e as its generation's event.
func wantGeneration(t *testing.T, s store.Store, e usage.Event) {
	t.Helper()
	if got, err := s.Generation(ctx(t), e.OrgID, e.GenerationID); err != nil || !sameEvent(got, e) {
		t.Errorf("Generation(%s) = %+v, %v; want %+v", e.GenerationID, got, err, e)
	}
}

// sameAt compares a and b, the time at points to by instant (stores give times back in UTC).
func sameAt[T comparable](a, b T, at func(*T) *time.Time) bool {
	ta, tb := at(&a), at(&b)
	if !ta.Equal(*tb) {
		return false
	}
	*ta, *tb = time.Time{}, time.Time{}
	return a == b
}

func sameEvent(a, b usage.Event) bool {
	return sameAt(a, b, func(e *usage.Event) *time.Time { return &e.StartedAt })
}

func sameEntry(a, b store.LedgerEntry) bool {
	return sameAt(a, b, func(e *store.LedgerEntry) *time.Time { return &e.At })
}

func sameOrg(a, b store.Org) bool {
	return sameAt(a, b, func(o *store.Org) *time.Time { return &o.CreatedAt })
}

func sameLease(a, b store.Lease) bool {
	return a.OrgID == b.OrgID && a.HolderID == b.HolderID && a.Expires.Equal(b.Expires)
}

func sameKey(a, b store.Key) bool {
	switch {
	case a.ID != b.ID || a.OrgID != b.OrgID || a.Hash != b.Hash || !a.CreatedAt.Equal(b.CreatedAt):
		return false
	case a.RevokedAt == nil || b.RevokedAt == nil:
		return a.RevokedAt == nil && b.RevokedAt == nil
	}
	return a.RevokedAt.Equal(*b.RevokedAt)
}

func generationIDs(events []usage.Event) []string {
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.GenerationID
	}
	return ids
}

func entryIDs(entries []store.LedgerEntry) []string {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	return ids
}
