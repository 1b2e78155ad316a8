package storetest

import (
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

func testOrgs(t *testing.T, s store.Store) {
	orgs, err := s.Orgs(ctx(t))
	if err != nil || len(orgs) != 0 {
		t.Fatalf("Orgs() of an empty store = %v, %v; want none", orgs, err)
	}
	explicit := store.Org{ID: "org-b", Name: "Bee", Status: store.OrgSuspended, MaxInFlight: 3, CreatedAt: at(time.Hour)}
	defaulted := store.Org{ID: "org-a", Name: "Ay", CreatedAt: t0}
	for _, o := range []store.Org{explicit, defaulted} {
		if err := s.CreateOrg(ctx(t), o); err != nil {
			t.Fatalf("CreateOrg(%+v): %v", o, err)
		}
	}
	// An empty status means active and a zero limit means the default.
	wantA := store.Org{ID: "org-a", Name: "Ay", Status: store.OrgActive, MaxInFlight: store.DefaultMaxInFlight, CreatedAt: t0}
	for _, want := range []store.Org{wantA, explicit} {
		got, err := s.Org(ctx(t), want.ID)
		if err != nil || !sameOrg(got, want) {
			t.Errorf("Org(%s) = %+v, %v; want %+v", want.ID, got, err, want)
		}
	}

	err = s.CreateOrg(ctx(t), store.Org{ID: "org-a", Name: "Impostor", MaxInFlight: 1, CreatedAt: t0})
	wantErr(t, "CreateOrg with a taken ID", err, store.ErrExists)
	if got, _ := s.Org(ctx(t), "org-a"); !sameOrg(got, wantA) {
		t.Errorf("after a refused CreateOrg, Org(org-a) = %+v, want %+v", got, wantA)
	}

	orgs, err = s.Orgs(ctx(t))
	if err != nil {
		t.Fatalf("Orgs: %v", err)
	}
	slices.SortFunc(orgs, func(a, b store.Org) int { return strings.Compare(a.ID, b.ID) })
	if len(orgs) != 2 || !sameOrg(orgs[0], wantA) || !sameOrg(orgs[1], explicit) {
		t.Errorf("Orgs() = %+v, want %+v and %+v", orgs, wantA, explicit)
	}

	_, err = s.Org(ctx(t), "org-missing")
	wantErr(t, "Org of an unknown ID", err, store.ErrNotFound)
}

func testOrgStatusAndLimit(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, 0)
	createOrg(t, s, "org-b", 2, 0)
	steps := []struct {
		name   string
		apply  func() error
		status store.OrgStatus
		limit  int
	}{
		{"suspend", func() error { return s.SetOrgStatus(ctx(t), "org-a", store.OrgSuspended) }, store.OrgSuspended, 2},
		{"set limit", func() error { return s.SetMaxInFlight(ctx(t), "org-a", 5) }, store.OrgSuspended, 5},
		{"resume", func() error { return s.SetOrgStatus(ctx(t), "org-a", store.OrgActive) }, store.OrgActive, 5},
		{"lower limit", func() error { return s.SetMaxInFlight(ctx(t), "org-a", 1) }, store.OrgActive, 1},
	}
	for _, step := range steps {
		if err := step.apply(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		o, err := s.Org(ctx(t), "org-a")
		if err != nil || o.Status != step.status || o.MaxInFlight != step.limit {
			t.Errorf("after %s, Org(org-a) = %+v, %v; want status %s, limit %d", step.name, o, err, step.status, step.limit)
		}
	}
	if o, _ := s.Org(ctx(t), "org-b"); o.Status != store.OrgActive || o.MaxInFlight != 2 {
		t.Errorf("changes to org-a changed org-b: %+v", o)
	}
	wantErr(t, "SetOrgStatus of an unknown org", s.SetOrgStatus(ctx(t), "org-missing", store.OrgSuspended), store.ErrNotFound)
	wantErr(t, "SetMaxInFlight of an unknown org", s.SetMaxInFlight(ctx(t), "org-missing", 4), store.ErrNotFound)
}

func hash(key string) [32]byte { return sha256.Sum256([]byte(key)) }

func createKeys(t *testing.T, s store.Store, keys ...store.Key) {
	t.Helper()
	for _, k := range keys {
		if err := s.CreateKey(ctx(t), k); err != nil {
			t.Fatalf("CreateKey(%s): %v", k.ID, err)
		}
	}
}

func testKeys(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 2, 0)
	createOrg(t, s, "org-b", 2, 0)
	k1 := store.Key{ID: "kiln-AAAAAAAA", OrgID: "org-a", Hash: hash("kiln-AAAAAAAA-secret-1"), CreatedAt: t0}
	k2 := store.Key{ID: "kiln-BBBBBBBB", OrgID: "org-a", Hash: hash("kiln-BBBBBBBB-secret-2"), CreatedAt: at(time.Minute)}
	k3 := store.Key{ID: "kiln-CCCCCCCC", OrgID: "org-b", Hash: hash("kiln-CCCCCCCC-secret-3"), CreatedAt: at(time.Second)}
	createKeys(t, s, k1, k2, k3)
	wantErr(t, "CreateKey with a taken ID", s.CreateKey(ctx(t),
		store.Key{ID: k1.ID, OrgID: "org-b", Hash: hash("another"), CreatedAt: t0}), store.ErrExists)
	wantErr(t, "CreateKey with a taken hash", s.CreateKey(ctx(t),
		store.Key{ID: "kiln-DDDDDDDD", OrgID: "org-b", Hash: k2.Hash, CreatedAt: t0}), store.ErrExists)
	if err := s.CreateKey(ctx(t), store.Key{ID: "kiln-EEEEEEEE", OrgID: "org-missing", Hash: hash("orphan"), CreatedAt: t0}); err == nil {
		t.Error("CreateKey for an unknown organization succeeded")
	}
	if _, err := s.Authenticate(ctx(t), hash("orphan")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a key refused for an unknown organization authenticates: %v", err)
	}

	wantKeys(t, s, "org-a", k1, k2)
	wantKeys(t, s, "org-b", k3)

	revoked := at(time.Hour)
	if err := s.RevokeKey(ctx(t), k2.ID, revoked); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	// Revoking again keeps the time the key stopped working.
	if err := s.RevokeKey(ctx(t), k2.ID, at(2*time.Hour)); err != nil {
		t.Fatalf("RevokeKey again: %v", err)
	}
	wantErr(t, "RevokeKey of an unknown key", s.RevokeKey(ctx(t), "kiln-ZZZZZZZZ", revoked), store.ErrNotFound)
	k2.RevokedAt = &revoked
	wantKeys(t, s, "org-a", k1, k2)
}

// wantKeys fails unless the organization's keys are want, in any order (want sorted by ID).
func wantKeys(t *testing.T, s store.Store, orgID string, want ...store.Key) {
	t.Helper()
	got, err := s.Keys(ctx(t), orgID)
	if err != nil {
		t.Fatalf("Keys(%s): %v", orgID, err)
	}
	slices.SortFunc(got, func(a, b store.Key) int { return strings.Compare(a.ID, b.ID) })
	if !slices.EqualFunc(got, want, sameKey) {
		t.Errorf("Keys(%s) = %+v, want %+v", orgID, got, want)
	}
}

func testAuthenticate(t *testing.T, s store.Store) {
	createOrg(t, s, "org-a", 4, 0)
	createOrg(t, s, "org-b", 6, 0)
	ka := store.Key{ID: "kiln-AAAAAAAA", OrgID: "org-a", Hash: hash("secret-a"), CreatedAt: t0}
	kb := store.Key{ID: "kiln-BBBBBBBB", OrgID: "org-b", Hash: hash("secret-b"), CreatedAt: t0}
	createKeys(t, s, ka, kb)
	check := func(what string, h [32]byte, want store.Principal) {
		t.Helper()
		got, err := s.Authenticate(ctx(t), h)
		if err != nil || got != want {
			t.Errorf("%s: Authenticate = %+v, %v; want %+v", what, got, err, want)
		}
	}
	check("key a", ka.Hash, store.Principal{KeyID: ka.ID, OrgID: "org-a", OrgStatus: store.OrgActive, MaxInFlight: 4})
	check("key b", kb.Hash, store.Principal{KeyID: kb.ID, OrgID: "org-b", OrgStatus: store.OrgActive, MaxInFlight: 6})

	_, err := s.Authenticate(ctx(t), hash("secret-unknown"))
	wantErr(t, "Authenticate of an unknown key", err, store.ErrNotFound)

	// A suspended organization's key still authenticates: the caller decides what to answer.
	must(t, s.SetOrgStatus(ctx(t), "org-a", store.OrgSuspended))
	must(t, s.SetMaxInFlight(ctx(t), "org-a", 2))
	check("key a of a suspended org", ka.Hash, store.Principal{KeyID: ka.ID, OrgID: "org-a", OrgStatus: store.OrgSuspended, MaxInFlight: 2})

	must(t, s.RevokeKey(ctx(t), ka.ID, at(time.Minute)))
	_, err = s.Authenticate(ctx(t), ka.Hash)
	wantErr(t, "Authenticate of a revoked key", err, store.ErrKeyRevoked)
	check("key b after a's revocation", kb.Hash, store.Principal{KeyID: kb.ID, OrgID: "org-b", OrgStatus: store.OrgActive, MaxInFlight: 6})
}

func testMaintenance(t *testing.T, s store.Store) {
	m, err := s.Maintenance(ctx(t))
	if err != nil || m.On || !m.Until.IsZero() {
		t.Fatalf("Maintenance() of an empty store = %+v, %v; want off", m, err)
	}
	for _, want := range []store.Maintenance{
		{On: true, Until: at(90 * time.Minute)},
		{On: true, Until: at(3 * time.Hour)},
		{On: false},
		{On: true, Until: at(time.Nanosecond)},
	} {
		if err := s.SetMaintenance(ctx(t), want); err != nil {
			t.Fatalf("SetMaintenance(%+v): %v", want, err)
		}
		got, err := s.Maintenance(ctx(t))
		if err != nil || got.On != want.On || !got.Until.Equal(want.Until) {
			t.Errorf("Maintenance() = %+v, %v; want %+v", got, err, want)
		}
		if got.Active(t0) != want.Active(t0) {
			t.Errorf("Maintenance() = %+v: Active(t0) = %v, want %v", got, got.Active(t0), want.Active(t0))
		}
	}
}
