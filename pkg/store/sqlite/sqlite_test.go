package sqlite_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/sqlite"
	"github.com/neocloud/kiln/pkg/store/storetest"
	"github.com/neocloud/kiln/pkg/usage"
)

func open(t testing.TB, dir string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(dir)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, t.TempDir()) })
}

// TestTwoProcesses runs the slot race through two stores on one directory, as the gateway and
// kilnctl would: the limit holds across connections, not only within one.
func TestTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	t.Cleanup(func() { a.Close(); b.Close() })
	storetest.RaceSlots(t, a, b)
}

func TestOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "kiln")
	s := open(t, dir)
	if want := filepath.Join(dir, sqlite.FileName); s.Path() != want {
		t.Errorf("Path() = %s, want %s", s.Path(), want)
	}
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o700 {
		t.Errorf("directory mode %o, want 700", perm)
	}
	createOrg := store.Org{ID: "org-a", Name: "A", CreatedAt: time.Unix(1, 0)}
	if err := s.CreateOrg(t.Context(), createOrg); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, sqlite.FileName+"-wal")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}

	// Reopening finds the data and leaves the schema as it was.
	s = open(t, dir)
	defer s.Close()
	if o, err := s.Org(t.Context(), "org-a"); err != nil || o.Name != "A" {
		t.Errorf("after reopening, Org = %+v, %v", o, err)
	}
}

func TestOpenNewerSchema(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	s.Close()
	setUserVersion(t, filepath.Join(dir, sqlite.FileName), 99)
	if s, err := sqlite.Open(dir); err == nil {
		s.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
}

func BenchmarkAdmitSettle(b *testing.B) {
	s := open(b, b.TempDir())
	defer s.Close()
	ctx := b.Context()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", CreatedAt: now}); err != nil {
		b.Fatal(err)
	}
	if err := s.AddEntry(ctx, store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp,
		Amount: 1000 * money.Dollar, At: now}); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "gen-" + time.Duration(i).String()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		lease, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: ids[i], Now: now})
		if err != nil {
			b.Fatal(err)
		}
		_, err = s.Settle(ctx, store.Settlement{Lease: lease, Now: now, Event: usage.Event{
			Version: usage.SchemaVersion, GenerationID: ids[i], OrgID: "org-a", KeyID: "kiln-AbC123xY",
			Model: "qwen3-32b", Endpoint: "/v1/chat/completions", Stream: true, Status: usage.StatusCompleted,
			HTTPStatus: 200, FinishReason: "stop", PromptTokens: 1200, CompletionTokens: 300, Cost: 1_155_000,
			StartedAt: now, TTFTMillis: 180, DurationMillis: 2400, Backend: "vllm-a",
		}})
		if err != nil {
			b.Fatal(err)
		}
	}
}

func setUserVersion(t *testing.T, path string, v int) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		t.Fatal(err)
	}
}
