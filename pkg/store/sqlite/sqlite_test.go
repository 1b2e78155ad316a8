package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	s, err := sqlite.Open(dir, sqlite.Options{})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s
}

// TestContract runs the contract on the store as kilnctl opens it; settlement folds the event
// into the aggregates.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, t.TempDir()) }, storetest.Options{FoldsAtSettlement: true})
}

// TestTwoProcesses runs the slot race through two stores on one directory, as the gateway and
// kilnctl would: the limit holds across connections, not only within one.
func TestTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	t.Cleanup(func() { a.Close(); b.Close() })
	storetest.RaceSlots(t, 0, a, b)
}

func TestOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "kiln")
	s := open(t, dir)
	if _, err := os.Stat(filepath.Join(dir, sqlite.FileName)); err != nil {
		t.Errorf("the database file: %v", err)
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
	if s, err := sqlite.Open(dir, sqlite.Options{}); err == nil {
		s.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
}

// TestCancelQueued: a caller that gives up while its write waits for the database lock (here
// held by another process) is told so, and its write never happens; Close applies what was
// queued before it.
func TestCancelQueued(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.CreateOrg(t.Context(), store.Org{ID: "org-a", Name: "A", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEntry(t.Context(), store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp,
		Amount: money.Dollar, At: now}); err != nil {
		t.Fatal(err)
	}

	// Another connection holds the write lock, as kilnctl in the middle of a write would.
	other, err := sql.Open("sqlite", filepath.Join(dir, sqlite.FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error)
	go func() {
		_, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: "gen-gave-up", Now: now})
		gaveUp <- err
	}()
	waited := make(chan error)
	go func() {
		time.Sleep(50 * time.Millisecond) // queued behind the first
		_, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-waited", Now: now})
		waited <- err
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-gaveUp:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Admit whose context was cancelled while queued: %v, want %v", err, context.Canceled)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Admit did not return when its context was cancelled")
	}
	if _, err := lock.ExecContext(t.Context(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Errorf("Admit that waited: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	leases, err := s.InFlight(t.Context(), "org-a", now)
	if err != nil || len(leases) != 1 || leases[0].HolderID != "gen-waited" {
		t.Errorf("InFlight = %+v, %v; want only gen-waited", leases, err)
	}
	if _, err := s.Admit(t.Context(), store.AdmitRequest{OrgID: "org-a", HolderID: "gen-after", Now: now}); err != nil {
		t.Errorf("Admit after reopening: %v", err)
	}
}

// TestBatchFailure: writes that share a transaction do not share a failure. A settlement that
// fails on a constraint (its generation id is already a ledger entry's) is refused alone, while
// the settlements, refusals and replays around it apply exactly once, on a store opened as
// kilnctl's is and on one opened as the gateway's is, whose batches also sum their debits and
// roll-ups. The writer is held until a full batch is queued, so that they share batches.
func TestBatchFailure(t *testing.T) {
	for _, cfg := range []struct {
		name string
		opt  sqlite.Options
	}{
		{"plain", sqlite.Options{}},
		{"gateway", sqlite.Options{OwnSlots: true}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			s, err := sqlite.Open(t.TempDir(), cfg.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			testBatchFailure(t, s)
		})
	}
}

func testBatchFailure(t *testing.T, s *sqlite.Store) {
	ctx := t.Context()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", MaxInFlight: 1000, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEntry(ctx, store.LedgerEntry{ID: "gen-poison", OrgID: "org-a", Kind: store.EntryTopUp,
		Amount: money.Dollar, At: now}); err != nil {
		t.Fatal(err)
	}
	const (
		n    = 200
		cost = money.Amount(1_000)
	)
	settle := func(gen string) (store.SettleResult, error) {
		return s.Settle(ctx, store.Settlement{Lease: store.Lease{OrgID: "org-a", HolderID: gen}, Now: now,
			Event: usage.Event{Version: usage.SchemaVersion, GenerationID: gen, OrgID: "org-a", Model: "m",
				Status: usage.StatusCompleted, Cost: cost, StartedAt: now}})
	}
	var (
		wg      sync.WaitGroup
		applied atomic.Int64
	)
	release := s.HoldWriter(t)
	for i := range n {
		wg.Go(func() {
			gen := "gen-" + strconv.Itoa(i)
			switch i % 4 {
			case 0: // the poison
				if _, err := settle("gen-poison"); err == nil {
					t.Error("Settle of gen-poison succeeded")
				}
				return
			case 1: // a holder id taken twice, and kept: one of the two is refused
				gen = "gen-dup-" + strconv.Itoa(i/8)
				_, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: gen, Now: now})
				if err != nil && !errors.Is(err, store.ErrExists) {
					t.Errorf("Admit(%s): %v", gen, err)
				}
				return
			}
			_, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: gen, Now: now})
			if err != nil {
				t.Errorf("Admit(%s): %v", gen, err)
				return
			}
			for range 2 { // a settlement and its replay
				res, err := settle(gen)
				if err != nil {
					t.Errorf("Settle(%s): %v", gen, err)
					return
				}
				if !res.AlreadyApplied {
					applied.Add(1)
				}
			}
		})
	}
	s.WaitQueued(t, 64) // a full batch
	release()
	wg.Wait()
	o, err := s.Org(ctx, "org-a")
	if err != nil {
		t.Fatal(err)
	}
	if want := money.Dollar - money.Amount(applied.Load())*cost; o.Balance != want {
		t.Errorf("balance %s after %d settlements, want %s", o.Balance, applied.Load(), want)
	}
	if want := int64(n / 2); applied.Load() != want {
		t.Errorf("%d settlements applied, want %d", applied.Load(), want)
	}
	events, err := s.Usage(ctx, "org-a", now, now.Add(time.Second))
	if err != nil || int64(len(events)) != applied.Load() {
		t.Errorf("Usage has %d events, %v; want %d", len(events), err, applied.Load())
	}
	if _, err := s.Generation(ctx, "org-a", "gen-poison"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Generation(gen-poison): %v, want %v", err, store.ErrNotFound)
	}
	if leases, err := s.InFlight(ctx, "org-a", now); err != nil || len(leases) != n/8 {
		t.Errorf("InFlight = %+v, %v; want the %d gen-dup holders", leases, err, n/8)
	}
	day := now.Format(time.DateOnly)
	rollups, err := s.DailyRollups(ctx, "org-a", day, day)
	if err != nil || len(rollups) != 1 || rollups[0].Requests != applied.Load() || rollups[0].Cost != money.Amount(applied.Load())*cost {
		t.Errorf("DailyRollups = %+v, %v; want %d requests costing %s", rollups, err, applied.Load(), money.Amount(applied.Load())*cost)
	}
}

// BenchmarkAdmitSettle is one Admit then one Settle, each timed alone, as DynamoDB's
// BenchmarkAdmitSettle is, on the store as pkg/config opens it for the local gateway: it reports
// the p50 and p99 of each (make bench's store table). A request is settled before its answer
// ends, so the settlement's time is what the end of every answer waits for.
func BenchmarkAdmitSettle(b *testing.B) {
	s, err := sqlite.Open(b.TempDir(), sqlite.Options{OwnSlots: true})
	if err != nil {
		b.Fatal(err)
	}
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
	admits, settles := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		lease, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: ids[i], Now: now})
		if err != nil {
			b.Fatal(err)
		}
		admitted := time.Now()
		_, err = s.Settle(ctx, store.Settlement{Lease: lease, Now: now, Event: usage.Event{
			Version: usage.SchemaVersion, GenerationID: ids[i], OrgID: "org-a", KeyID: "kiln-AbC123xY",
			Model: "qwen3-32b", Endpoint: "/v1/chat/completions", Stream: true, Status: usage.StatusCompleted,
			HTTPStatus: 200, FinishReason: "stop", PromptTokens: 1200, CompletionTokens: 300, Cost: 1_155_000,
			StartedAt: now, TTFTMillis: 180, DurationMillis: 2400, Backend: "vllm-a",
		}})
		if err != nil {
			b.Fatal(err)
		}
		admits, settles = append(admits, admitted.Sub(start)), append(settles, time.Since(admitted))
	}
	b.StopTimer()
	storetest.ReportAdmitSettle(b, admits, settles)
}

// BenchmarkAdmitSettleParallel is BenchmarkAdmitSettle from many goroutines at once, as the
// gateway under load calls the store: each iteration is one Admit and one Settle with its own
// generation id, on an organization whose limit no goroutine count reaches. It runs on a store
// opened as kilnctl's is and on one opened as the local gateway's is (slots in memory), and
// reports the process's CPU per iteration. The gateway's store runs with enough goroutines to
// fill a batch (64), as many settlements wait at once under load.
func BenchmarkAdmitSettleParallel(b *testing.B) {
	for _, cfg := range []struct {
		name       string
		opt        sqlite.Options
		goroutines []int
	}{
		{"plain", sqlite.Options{}, []int{8, 32}},
		// As pkg/config opens the local gateway's store.
		{"gateway", sqlite.Options{OwnSlots: true}, []int{64, 256}},
	} {
		for _, goroutines := range cfg.goroutines {
			b.Run(fmt.Sprintf("%s/goroutines=%d", cfg.name, goroutines), func(b *testing.B) {
				benchAdmitSettleParallel(b, cfg.opt, goroutines)
			})
		}
	}
}

func benchAdmitSettleParallel(b *testing.B, opt sqlite.Options, goroutines int) {
	s, err := sqlite.Open(b.TempDir(), opt)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := b.Context()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", MaxInFlight: 1 << 20, CreatedAt: now}); err != nil {
		b.Fatal(err)
	}
	if err := s.AddEntry(ctx, store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp,
		Amount: 1_000_000 * money.Dollar, At: now}); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	// SetParallelism multiplies GOMAXPROCS; round up so that at least this many run.
	b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	defer func() { b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-us/op") }()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "gen-" + strconv.FormatInt(next.Add(1), 10)
			lease, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: id, Now: now})
			if err != nil {
				b.Error(err)
				return
			}
			_, err = s.Settle(ctx, store.Settlement{Lease: lease, Now: now, Event: usage.Event{
				Version: usage.SchemaVersion, GenerationID: id, OrgID: "org-a", KeyID: "kiln-AbC123xY",
				Model: "qwen3-32b", Endpoint: "/v1/chat/completions", Stream: true, Status: usage.StatusCompleted,
				HTTPStatus: 200, FinishReason: "stop", PromptTokens: 1200, CompletionTokens: 300, Cost: 1_155_000,
				StartedAt: now, TTFTMillis: 180, DurationMillis: 2400, Backend: "vllm-a",
			}})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// TestCheckpoints: the writer never checkpoints by itself (wal_autocheckpoint is 0 on its
// connection), so without the store's own checkpoints the WAL would hold every page ever
// written. After ten thousand settlements in a row, each a commit of its own (about 6 pages:
// some 240 MiB of WAL unchecked), the next writes must find the WAL started over and truncated
// to the size limit.
func TestCheckpoints(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	ctx := t.Context()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", MaxInFlight: 8, Status: store.OrgActive, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEntry(ctx, store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp,
		Amount: 1000 * money.Dollar, At: now}); err != nil {
		t.Fatal(err)
	}
	settle := func(i int) {
		_, err := s.Settle(ctx, store.Settlement{Now: now, Event: usage.Event{
			Version: usage.SchemaVersion, GenerationID: "gen-" + strconv.Itoa(i), OrgID: "org-a", KeyID: "kiln-AbC123xY",
			Model: "qwen3-32b", Endpoint: "/v1/chat/completions", Status: usage.StatusCompleted,
			HTTPStatus: 200, FinishReason: "stop", PromptTokens: 12, CompletionTokens: 30, Cost: 1_155_000,
			StartedAt: now, Backend: "vllm-a",
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	const settlements = 10_000
	for i := range settlements {
		settle(i)
	}
	wal := filepath.Join(dir, sqlite.FileName+"-wal")
	deadline := time.Now().Add(5 * time.Second)
	for i := settlements; ; i++ {
		settle(i)
		fi, err := os.Stat(wal)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() <= 32<<20 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("WAL still %d MiB 5 s after %d settlements: nothing checkpoints it", fi.Size()>>20, settlements)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openGateway opens dir as the gateway does: slots in memory.
func openGateway(t testing.TB, dir string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(dir, sqlite.Options{OwnSlots: true})
	if err != nil {
		t.Fatalf("Open(%s, OwnSlots): %v", dir, err)
	}
	return s
}

// TestContractOwnSlots runs the contract on the gateway's store: slots in memory.
func TestContractOwnSlots(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openGateway(t, t.TempDir()) }, storetest.Options{FoldsAtSettlement: true})
}

// TestOwnSlots: one gateway's store per directory (a second is refused while the first is open,
// and admitted once it closed), kilnctl's store alongside it sees its slots in the leases table
// soon after they change, and none once it closed; kilnctl's changes reach its admissions.
func TestOwnSlots(t *testing.T) {
	dir := t.TempDir()
	gw := openGateway(t, dir)
	if s, err := sqlite.Open(dir, sqlite.Options{OwnSlots: true}); err == nil {
		s.Close()
		t.Fatal("a second gateway store opened on the same directory")
	} else if !strings.Contains(err.Error(), sqlite.LockName) {
		t.Errorf("second gateway store: %v; want the lock file named", err)
	}
	ctl := open(t, dir) // kilnctl
	defer ctl.Close()
	ctx := t.Context()
	now := time.Now()
	if err := ctl.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", MaxInFlight: 2, Status: store.OrgActive, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := ctl.AddEntry(ctx, store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp, Amount: money.Dollar, At: now}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"gen-1", "gen-2"} {
		if _, err := gw.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: h, Now: now}); err != nil {
			t.Fatalf("Admit(%s): %v", h, err)
		}
	}
	if _, err := gw.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: "gen-3", Now: now}); !errors.Is(err, store.ErrSlotsFull) {
		t.Fatalf("third Admit at limit 2: %v, want ErrSlotsFull", err)
	}
	waitLeases := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			leases, err := ctl.InFlight(ctx, "org-a", now)
			var got []string
			for _, l := range leases {
				got = append(got, l.HolderID)
			}
			if err == nil && slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("kilnctl's store sees %v (%v), want %v", got, err, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLeases("gen-1", "gen-2")
	if _, err := gw.Settle(ctx, store.Settlement{Lease: store.Lease{OrgID: "org-a", HolderID: "gen-1"}, Now: now, Event: usage.Event{
		Version: usage.SchemaVersion, GenerationID: "gen-1", OrgID: "org-a", KeyID: "kiln-AbC123xY", Model: "qwen3-32b",
		Endpoint: "/v1/chat/completions", Status: usage.StatusCompleted, HTTPStatus: 200, Cost: 1, StartedAt: now, Backend: "vllm-a",
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: "gen-3", Now: now}); err != nil {
		t.Fatalf("Admit after a settlement freed a slot: %v", err)
	}
	waitLeases("gen-2", "gen-3")
	// kilnctl suspends the organization: the gateway's store, which keeps its row for a moment,
	// refuses it soon after (suspension comes before the full slots in the order of checks).
	if err := ctl.SetOrgStatus(ctx, "org-a", store.OrgSuspended); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); ; {
		_, err := gw.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: "gen-4", Now: now})
		if errors.Is(err, store.ErrSuspended) {
			break
		}
		if !errors.Is(err, store.ErrSlotsFull) || time.Now().After(deadline) {
			t.Fatalf("Admit after kilnctl suspended the organization: %v, want ErrSuspended within 2 s", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := gw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitLeases()
	again := openGateway(t, dir)
	if err := again.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestCloseTwice: a second Close, as deferred cleanups do, returns the first one's outcome.
func TestCloseTwice(t *testing.T) {
	for _, s := range []*sqlite.Store{open(t, t.TempDir()), openGateway(t, t.TempDir())} {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}

// settleCost settles a completed generation of cost, with no lease.
// TestAdmitAfterSettleInOneBatch: without OwnSlots, admission reads the balance in the write
// transaction; a settlement before it in the same batch, which frees the slot, has debited it too.
func TestAdmitAfterSettleInOneBatch(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	ctx := t.Context()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.CreateOrg(ctx, store.Org{ID: "org-a", Name: "A", MaxInFlight: 1, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEntry(ctx, store.LedgerEntry{ID: "top", OrgID: "org-a", Kind: store.EntryTopUp, Amount: 10, At: now}); err != nil {
		t.Fatal(err)
	}
	lease, err := s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: "h1", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	release := s.HoldWriter(t)
	wg.Go(func() {
		if _, err := s.Settle(ctx, store.Settlement{Lease: lease, Now: now, Event: usage.Event{Version: usage.SchemaVersion,
			GenerationID: "h1", OrgID: "org-a", Model: "m", Status: usage.StatusCompleted, Cost: 10, StartedAt: now}}); err != nil {
			t.Error(err)
		}
	})
	s.WaitQueued(t, 1)
	wg.Go(func() { _, err = s.Admit(ctx, store.AdmitRequest{OrgID: "org-a", HolderID: "h2", Now: now}) })
	s.WaitQueued(t, 2) // in the same batch, after it
	release()
	wg.Wait()
	// Settled first, the balance is 0; admitted first, the slot is taken. Either way, refused.
	if !errors.Is(err, store.ErrInsufficientCredits) && !errors.Is(err, store.ErrSlotsFull) {
		t.Errorf("Admit after a settlement that spent the balance: %v", err)
	}
}
