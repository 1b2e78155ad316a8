package main

import (
	"context"
	"encoding/csv"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/store"
)

type keyJSON struct {
	ID        string `json:"id"`
	OrgID     string `json:"org_id"`
	CreatedAt string `json:"created_at"`
	Revoked   bool   `json:"revoked"`
	RevokedAt string `json:"revoked_at"`
}

type entryJSON struct {
	ID     string `json:"id"`
	OrgID  string `json:"org_id"`
	Kind   string `json:"kind"`
	Amount string `json:"amount"`
	Note   string `json:"note"`
	At     string `json:"at"`
}

type orgShowJSON struct {
	orgJSON
	InFlight int `json:"in_flight"`
	Leases   []struct {
		HolderID string `json:"holder_id"`
		Expires  string `json:"expires"`
	} `json:"leases"`
}

type maintenanceJSON struct {
	On     bool   `json:"on"`
	Until  string `json:"until"`
	Active bool   `json:"active"`
}

var (
	generatedOrgID = regexp.MustCompile(`^org_[0-9a-hjkmnp-tv-z]{20}$`)
	printedKey     = regexp.MustCompile(`kiln-[0-9A-Za-z]{40}`)
)

// TestOperatorScenario walks an organization through its life with kilnctl and checks each
// step both in kilnctl's output and in the store the gateway reads.
func TestOperatorScenario(t *testing.T) {
	e := newTestEnv(t)
	st := e.store()
	ctx := context.Background()

	// Organizations.
	var acme orgJSON
	e.json(&acme, "org", "create", "--name", "Acme Corp")
	if !generatedOrgID.MatchString(acme.ID) || acme.Name != "Acme Corp" || acme.Status != "active" ||
		acme.MaxInFlight != store.DefaultMaxInFlight || acme.Balance != "0" {
		t.Fatalf("org create: %+v", acme)
	}
	if _, err := time.Parse(time.RFC3339Nano, acme.CreatedAt); err != nil || !strings.HasSuffix(acme.CreatedAt, "Z") {
		t.Errorf("created_at %q: want RFC 3339 UTC", acme.CreatedAt)
	}
	if out := e.ok("org", "create", "--id", "org_beta", "--name", "Beta", "--max-in-flight", "3"); !strings.Contains(out, "org_beta") {
		t.Errorf("org create prints %q", out)
	}
	var orgs []orgJSON
	e.json(&orgs, "org", "list")
	if len(orgs) != 2 || orgs[0].ID != acme.ID || orgs[1].ID != "org_beta" || orgs[1].MaxInFlight != 3 {
		t.Fatalf("org list: %+v", orgs)
	}
	if out := e.ok("org", "list"); !strings.Contains(out, "Acme Corp") || !strings.Contains(out, "BALANCE USD") {
		t.Errorf("org list:\n%s", out)
	}

	// Keys: the printed key is the one the gateway authenticates, and it is never listed.
	var created struct {
		Key   string `json:"key"`
		ID    string `json:"id"`
		OrgID string `json:"org_id"`
	}
	code, out, errOut := e.run("key", "create", "--org", acme.ID, "--json")
	if code != 0 {
		t.Fatalf("key create: exit %d: %s", code, errOut)
	}
	decodeOne(t, out, &created)
	if !apikey.Valid(created.Key) || created.ID != apikey.ID(created.Key) || created.OrgID != acme.ID {
		t.Fatalf("key create: %+v", created)
	}
	if !strings.Contains(errOut, "shown only once") {
		t.Errorf("key create --json warns nowhere: stderr %q", errOut)
	}
	p, err := st.Authenticate(ctx, apikey.Hash(created.Key))
	if err != nil || p.OrgID != acme.ID || p.KeyID != created.ID {
		t.Fatalf("Authenticate(printed key) = %+v, %v", p, err)
	}
	text := e.ok("key", "create", "--org", acme.ID)
	second := printedKey.FindString(text)
	if second == "" || !strings.Contains(text, "shown only once") {
		t.Fatalf("key create prints:\n%s", text)
	}
	if p, err := st.Authenticate(ctx, apikey.Hash(second)); err != nil || p.OrgID != acme.ID {
		t.Fatalf("Authenticate(second key) = %+v, %v", p, err)
	}
	listed := e.ok("key", "list", "--org", acme.ID, "--json")
	if strings.Contains(listed, created.Key) || strings.Contains(listed, second) {
		t.Fatal("key list shows a secret")
	}
	var keys []keyJSON
	decodeOne(t, listed, &keys)
	if len(keys) != 2 || keys[0].ID != created.ID || keys[0].Revoked || keys[1].ID != apikey.ID(second) {
		t.Fatalf("key list: %+v", keys)
	}

	// Credits: exact sums, whatever the number of decimals.
	e.ok("credits", "add", "--org", acme.ID, "--usd", "10.00", "--note", "first top-up")
	var added struct {
		Entry   entryJSON `json:"entry"`
		Balance string    `json:"balance"`
	}
	e.json(&added, "credits", "add", "--org", acme.ID, "--usd", "0.000001")
	if !strings.HasPrefix(added.Entry.ID, "top_") || added.Entry.Kind != "top_up" || added.Entry.Amount != "0.000001" ||
		added.Balance != "10.000001" {
		t.Fatalf("credits add: %+v", added)
	}
	if out := e.ok("credits", "adjust", "--org", acme.ID, "--usd", "-1.50", "--note", "goodwill, reversed"); !strings.Contains(out, "8.500001 USD") {
		t.Errorf("credits adjust prints %q", out)
	}
	var shown struct {
		OrgID       string `json:"org_id"`
		Status      string `json:"status"`
		Balance     string `json:"balance"`
		Reserved    string `json:"reserved"`
		Available   string `json:"available"`
		MaxInFlight int    `json:"max_in_flight"`
	}
	e.json(&shown, "credits", "show", "--org", acme.ID)
	if shown.Balance != "8.500001" || shown.Reserved != "0" || shown.Available != "8.500001" || shown.MaxInFlight != 8 || shown.OrgID != acme.ID {
		t.Fatalf("credits show: %+v", shown)
	}
	if o, err := st.Org(ctx, acme.ID); err != nil || o.Balance.String() != "8.500001" {
		t.Fatalf("stored balance %s, %v", o.Balance, err)
	}
	rows, err := csv.NewReader(strings.NewReader(e.ok("credits", "ledger", "--org", acme.ID, "--csv"))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || strings.Join(rows[0], ",") != "id,time,kind,amount,note" {
		t.Fatalf("ledger CSV: %q", rows)
	}
	for i, want := range [][3]string{{"top_up", "10", "first top-up"}, {"top_up", "0.000001", ""}, {"adjustment", "-1.5", "goodwill, reversed"}} {
		r := rows[i+1]
		if r[2] != want[0] || r[3] != want[1] || r[4] != want[2] {
			t.Errorf("ledger row %d: %q, want kind, amount, note %q", i+1, r, want)
		}
		if at, err := time.Parse(time.RFC3339Nano, r[1]); err != nil || at.Location() != time.UTC || !strings.HasSuffix(r[1], "Z") {
			t.Errorf("ledger row %d time %q: want RFC 3339 UTC", i+1, r[1])
		}
	}
	if !strings.HasPrefix(rows[1][0], "top_") || !strings.HasPrefix(rows[3][0], "adj_") {
		t.Errorf("ledger ids: %q, %q", rows[1][0], rows[3][0])
	}
	var entries []entryJSON
	e.json(&entries, "credits", "ledger", "--org", acme.ID)
	if len(entries) != 3 || entries[2].Amount != "-1.5" || entries[2].Kind != "adjustment" {
		t.Fatalf("ledger JSON: %+v", entries)
	}
	if out := e.ok("credits", "ledger", "--org", acme.ID); !strings.Contains(out, "-1.50") || !strings.Contains(out, "10.00") {
		t.Errorf("ledger text:\n%s", out)
	}

	// Suspension: a suspended organization can still get keys, with a warning.
	var o orgJSON
	e.json(&o, "org", "suspend", acme.ID)
	if o.Status != "suspended" {
		t.Fatalf("org suspend: %+v", o)
	}
	if p, _ := st.Authenticate(ctx, apikey.Hash(created.Key)); p.OrgStatus != store.OrgSuspended {
		t.Errorf("the gateway sees %q", p.OrgStatus)
	}
	code, out, errOut = e.run("key", "create", "--org", acme.ID)
	if code != 0 || !strings.Contains(errOut, "suspended") || printedKey.FindString(out) == "" {
		t.Fatalf("key create on a suspended org: exit %d, stderr %q", code, errOut)
	}
	if out := e.ok("org", "resume", acme.ID); !strings.Contains(out, "active") {
		t.Errorf("org resume prints %q", out)
	}
	var detail orgShowJSON
	e.json(&detail, "org", "show", acme.ID)
	if detail.Status != "active" || detail.Balance != "8.500001" || detail.InFlight != 0 {
		t.Fatalf("org show: %+v", detail)
	}

	// Limits; flags may also come before the positional arguments.
	e.json(&o, "org", "set-limit", "--json", acme.ID, "25")
	if o.MaxInFlight != 25 {
		t.Fatalf("org set-limit: %+v", o)
	}
	if p, _ := st.Authenticate(ctx, apikey.Hash(created.Key)); p.MaxInFlight != 25 {
		t.Errorf("the gateway sees limit %d", p.MaxInFlight)
	}

	// In-flight requests appear in org show.
	_, err = st.Admit(ctx, store.AdmitRequest{OrgID: acme.ID, HolderID: "gen-held", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	e.json(&detail, "org", "show", acme.ID)
	if detail.InFlight != 1 || len(detail.Leases) != 1 || detail.Leases[0].HolderID != "gen-held" {
		t.Fatalf("org show with a request in flight: %+v", detail)
	}
	if out := e.ok("org", "show", acme.ID); !strings.Contains(out, "1 of 25") {
		t.Errorf("org show:\n%s", out)
	}

	// Revocation.
	var revoked struct {
		ID      string `json:"id"`
		Revoked bool   `json:"revoked"`
	}
	e.json(&revoked, "key", "revoke", created.ID)
	if revoked.ID != created.ID || !revoked.Revoked {
		t.Fatalf("key revoke: %+v", revoked)
	}
	if _, err := st.Authenticate(ctx, apikey.Hash(created.Key)); !errors.Is(err, store.ErrKeyRevoked) {
		t.Fatalf("Authenticate(revoked key): %v", err)
	}
	if _, err := st.Authenticate(ctx, apikey.Hash(second)); err != nil {
		t.Fatalf("revoking one key touched another: %v", err)
	}
	e.json(&keys, "key", "list", "--org", acme.ID)
	if len(keys) != 3 || !keys[0].Revoked || keys[0].RevokedAt == "" || keys[1].Revoked {
		t.Fatalf("key list after revoke: %+v", keys)
	}

	// Maintenance.
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	e.ok("maintenance", "on", "--until", until.Format(time.RFC3339))
	var m maintenanceJSON
	e.json(&m, "maintenance", "show")
	if !m.On || !m.Active || m.Until != until.Format(time.RFC3339) {
		t.Fatalf("maintenance show: %+v", m)
	}
	if sm, err := st.Maintenance(ctx); err != nil || !sm.Active(time.Now()) || !sm.Until.Equal(until) {
		t.Fatalf("stored maintenance %+v, %v", sm, err)
	}
	if out := e.ok("maintenance", "show"); !strings.Contains(out, "503") {
		t.Errorf("maintenance show: %q", out)
	}
	e.json(&m, "maintenance", "off")
	if m.On || m.Active {
		t.Fatalf("maintenance off: %+v", m)
	}
	if sm, err := st.Maintenance(ctx); err != nil || sm.Active(time.Now()) {
		t.Fatalf("stored maintenance after off: %+v, %v", sm, err)
	}
}
