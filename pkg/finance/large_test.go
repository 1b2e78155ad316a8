package finance

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/money"
)

// largeItems is the number of requests of the generated export: about 95 MB of DynamoDB JSON
// (ledger and usage), a third of that under the race detector. KILN_FINANCE_LARGE=N generates N
// instead, to measure.
func largeItems() int {
	if n, err := strconv.Atoi(os.Getenv("KILN_FINANCE_LARGE")); err == nil && n > 0 {
		return n
	}
	if raceEnabled {
		return 30_000
	}
	return 100_000
}

// writeLarge writes a bare export of n requests, each with its debit, straight to gzip files
// (never holding them in memory), and returns the exact total cost and the JSON's size.
func writeLarge(t testing.TB, root string, n int) (total money.Amount, jsonBytes int64) {
	t.Helper()
	open := func(name string) (*os.File, *gzip.Writer, *bufio.Writer) {
		path := filepath.Join(root, name, "AWSDynamoDB", "x", "data", "part.json.gz")
		os.MkdirAll(filepath.Dir(path), 0o755)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
		return f, zw, bufio.NewWriter(zw)
	}
	uf, uz, uw := open("usage")
	lf, lz, lw := open("ledger")
	for i := range n {
		org := fmt.Sprintf("org_%03d", i%50)
		gen := fmt.Sprintf("gen-%026d", i)
		started := day1.Add(time.Duration(i) * (48 * time.Hour / time.Duration(n)))
		cost := int64(1_000_000 + i%7919*1_000)
		total += money.Amount(cost)
		u := usageItem(org, gen, "gpt-oss-120b", started, cost, "completed")
		d := debitItem(org, gen, cost, started.Add(time.Second))
		uw.WriteString(u)
		uw.WriteByte('\n')
		lw.WriteString(d)
		lw.WriteByte('\n')
		jsonBytes += int64(len(u) + len(d) + 2)
	}
	for _, c := range []struct {
		f *os.File
		z *gzip.Writer
		w *bufio.Writer
	}{{uf, uz, uw}, {lf, lz, lw}} {
		if err := c.w.Flush(); err != nil {
			t.Fatal(err)
		}
		c.z.Close()
		c.f.Close()
	}
	return total, jsonBytes
}

// heapPeak samples the live heap while fn runs, after a collection every sample, so that the
// figure is what the reader keeps, not garbage waiting for the collector.
type heapPeak struct{ max uint64 }

func (h *heapPeak) sample() {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	h.max = max(h.max, m.HeapAlloc)
}

// TestLargeExportInBoundedMemory reads a generated export of 100,000 requests (30,000 under the
// race detector) (and their
// debits) for the report and for the reconciliation, and checks that the live heap stays small:
// the reader holds one line at a time, the reconciliation one spill partition at a time.
func TestLargeExportInBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the large export takes a while under the race detector")
	}
	ctx := context.Background()
	root := t.TempDir()
	n := largeItems()
	total, jsonBytes := writeLarge(t, root, n)
	var size int64
	filepath.Walk(root, func(_ string, info os.FileInfo, _ error) error {
		if info != nil && !info.IsDir() {
			size += info.Size()
		}
		return nil
	})
	x, err := Open(ctx, root, nil)
	if err != nil {
		t.Fatal(err)
	}

	var before heapPeak
	before.sample()
	var peak heapPeak
	var sum money.Amount
	count := 0
	if _, err := x.Records(ctx, "2026-11-29", "2026-11-30", "", func(r Record) error {
		sum += r.Cost
		if count++; count%20_000 == 0 {
			peak.sample()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if count != n || sum != total {
		t.Fatalf("report read %d records, %s; want %d, %s", count, sum, n, total)
	}
	t.Logf("report: %d requests, %d MiB of DynamoDB JSON, %d MiB gzipped; live heap %.1f MiB before, peak %.1f MiB while reading",
		n, jsonBytes>>20, size>>20, float64(before.max)/(1<<20), float64(peak.max)/(1<<20))
	if grew := int64(peak.max) - int64(before.max); grew > 16<<20 {
		t.Errorf("reading the export grew the live heap by %d MiB; want it bounded (under 16 MiB)", grew>>20)
	}

	// The reconciliation: the spill files are joined one at a time; sample inside the join too.
	var rpeak heapPeak
	r, err := NewReconciler(Options{From: "2026-11-29", To: "2026-11-30", MaxListed: 10})
	if err != nil {
		t.Fatal(err)
	}
	count = 0
	if err := x.Items(ctx, []Table{Ledger, Usage}, func(tb Table, it Item) error {
		if count++; count%50_000 == 0 {
			rpeak.sample()
		}
		return r.Item(tb, it)
	}); err != nil {
		t.Fatal(err)
	}
	rpeak.sample()
	r.afterPartition = rpeak.sample
	res, err := r.Finish()
	if err != nil {
		t.Fatal(err)
	}
	rpeak.sample()
	var ledger money.Amount
	for _, row := range res.Rows {
		ledger += row.Ledger
	}
	if !res.Agrees || ledger != total || len(res.Rows) != 100 {
		t.Fatalf("the large books do not reconcile: %d rows, ledger %s, %d differences", len(res.Rows), ledger, res.DifferenceCount)
	}
	t.Logf("reconcile: peak %.1f MiB while reading and joining", float64(rpeak.max)/(1<<20))
	if grew := int64(rpeak.max) - int64(before.max); grew > 32<<20 {
		t.Errorf("the reconciliation grew the live heap by %d MiB; want it bounded (under 32 MiB)", grew>>20)
	}
}
