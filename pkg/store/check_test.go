package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

func TestRefusalOrder(t *testing.T) {
	for _, tc := range []struct {
		name        string
		status      store.OrgStatus
		available   money.Amount
		reserve     money.Amount
		held, limit int
		want        error
	}{
		{"fits", store.OrgActive, 10, 10, 1, 2, nil},
		{"suspended before everything", store.OrgSuspended, 0, 5, 2, 2, store.ErrSuspended},
		{"credits before slots", store.OrgActive, 4, 5, 2, 2, store.ErrInsufficientCredits},
		{"nothing available, nothing reserved", store.OrgActive, 0, 0, 0, 2, store.ErrInsufficientCredits},
		{"below zero", store.OrgActive, -1, 0, 0, 2, store.ErrInsufficientCredits},
		{"slots full", store.OrgActive, 10, 5, 2, 2, store.ErrSlotsFull},
		{"above a lowered limit", store.OrgActive, 10, 5, 3, 2, store.ErrSlotsFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := store.Refusal(tc.status, tc.available, tc.reserve, tc.held, tc.limit); got != tc.want {
				t.Errorf("Refusal = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWrapf(t *testing.T) {
	if err := store.Wrapf(nil, "admit %s", "org-a"); err != nil {
		t.Errorf("Wrapf(nil) = %v, want nil", err)
	}
	err := store.Wrapf(store.ErrSlotsFull, "admit %s", "org-a")
	if !errors.Is(err, store.ErrSlotsFull) || err.Error() != "admit org-a: in-flight limit reached" {
		t.Errorf("Wrapf = %q, want %q wrapping ErrSlotsFull", err, "admit org-a: in-flight limit reached")
	}
}

func TestLeaseTimes(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 1, time.UTC)
	n, expires, err := store.LeaseTimes(now, 0)
	if err != nil || n != now.UnixNano() || expires != now.Add(store.DefaultLeaseTTL).UnixNano() {
		t.Errorf("LeaseTimes(now, 0) = %d, %d, %v; want the default TTL", n, expires, err)
	}
	if _, expires, _ := store.LeaseTimes(now, time.Second); expires != now.Add(time.Second).UnixNano() {
		t.Errorf("LeaseTimes(now, 1s) expires at %d", expires)
	}
	if _, _, err := store.LeaseTimes(now, -time.Second); err == nil {
		t.Error("LeaseTimes with a negative ttl: no error")
	}
	if _, _, err := store.LeaseTimes(time.Time{}, time.Second); err == nil {
		t.Error("LeaseTimes at the zero time: no error")
	}
}

func TestOptUnixNanos(t *testing.T) {
	if n, err := store.OptUnixNanos("at", time.Time{}); n != nil || err != nil {
		t.Errorf("OptUnixNanos(zero) = %v, %v; want nil, nil", n, err)
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	n, err := store.OptUnixNanos("at", at)
	if err != nil || n == nil || !store.FromOptUnixNanos(n).Equal(at) {
		t.Errorf("OptUnixNanos(%v) = %v, %v; does not round-trip", at, n, err)
	}
	if !store.FromOptUnixNanos(nil).IsZero() {
		t.Error("FromOptUnixNanos(nil) is not the zero time")
	}
	if _, err := store.OptUnixNanos("at", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil {
		t.Error("OptUnixNanos of the year 3000: no error")
	}
}

func TestChecks(t *testing.T) {
	org, _, err := store.NewOrg(store.Org{ID: "org-a"})
	if err != nil || org.Status != store.OrgActive || org.MaxInFlight != store.DefaultMaxInFlight {
		t.Errorf("NewOrg with defaults = %+v, %v", org, err)
	}
	revoked := time.Now()
	gen := "gen-1"
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"an org without id", third(store.NewOrg(store.Org{}))},
		{"an org with a balance", third(store.NewOrg(store.Org{ID: "org-a", Balance: 1}))},
		{"an org with an unknown status", third(store.NewOrg(store.Org{ID: "org-a", Status: "closed"}))},
		{"an org with a negative limit", third(store.NewOrg(store.Org{ID: "org-a", MaxInFlight: -1}))},
		{"a key without id", second(store.CheckNewKey(store.Key{}))},
		{"a revoked new key", second(store.CheckNewKey(store.Key{ID: "kiln-a", RevokedAt: &revoked}))},
		{"an entry without organization", second(store.CheckEntry(store.LedgerEntry{ID: "e", Kind: store.EntryTopUp, Amount: 1}))},
		{"a top-up of zero", second(store.CheckEntry(store.LedgerEntry{ID: "e", OrgID: "org-a", Kind: store.EntryTopUp}))},
		{"an adjustment of zero", second(store.CheckEntry(store.LedgerEntry{ID: "e", OrgID: "org-a", Kind: store.EntryAdjustment}))},
		{"a debit", second(store.CheckEntry(store.LedgerEntry{ID: "e", OrgID: "org-a", Kind: store.EntryDebit, Amount: -1}))},
		{"a negative reservation", third(store.AdmitRequest{OrgID: "org-a", HolderID: gen, Now: revoked, Reserve: -1}.Times())},
		{"a settlement of another org's lease", second(store.Settlement{Lease: store.Lease{OrgID: "org-b"},
			Event: usage.Event{OrgID: "org-a", GenerationID: gen}, Now: revoked}.Check())},
		{"a negative cost", second(store.Settlement{Event: usage.Event{OrgID: "org-a", GenerationID: gen, Cost: -1}, Now: revoked}.Check())},
		{"an incomplete delta", store.CheckDelta(usage.Delta{OrgID: "org-a", GenerationID: gen})},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	for _, err := range []error{
		second(store.CheckEntry(store.LedgerEntry{ID: "e", OrgID: "org-a", Kind: store.EntryAdjustment, Amount: -1, At: revoked})),
		third(store.AdmitRequest{OrgID: "org-a", HolderID: gen, Now: revoked}.Times()),
		second(store.Settlement{Event: usage.Event{OrgID: "org-a", GenerationID: gen}, Now: revoked}.Check()),
	} {
		if err != nil {
			t.Errorf("refused: %v", err)
		}
	}
}

func second[A any](_ A, err error) error        { return err }
func third[A, B any](_ A, _ B, err error) error { return err }
