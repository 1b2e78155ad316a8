package finance

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/money"
)

func TestDecodeLineReadsDynamoDBJSONExactly(t *testing.T) {
	it, err := DecodeLine([]byte(`{"Item":{"a":{"S":"x"},"n":{"N":"-123456789012345678901234567890"},"b":{"BOOL":false},` +
		`"z":{"NULL":true},"m":{"M":{"k":{"N":"1.5"}}},"l":{"L":[{"S":"y"}]},"ss":{"SS":["p","q"]},"ns":{"NS":["1"]},"bin":{"B":"AAE="}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := it["n"].(*types.AttributeValueMemberN).Value; n != "-123456789012345678901234567890" {
		t.Errorf("a number is kept as its decimal string: %q", n)
	}
	if m := it["m"].(*types.AttributeValueMemberM).Value["k"].(*types.AttributeValueMemberN).Value; m != "1.5" {
		t.Errorf("nested number %q", m)
	}
	if b := it["bin"].(*types.AttributeValueMemberB).Value; len(b) != 2 || b[1] != 1 {
		t.Errorf("binary %v", b)
	}
	if it, err := DecodeLine([]byte("  \n")); it != nil || err != nil {
		t.Errorf("an empty line: %v, %v", it, err)
	}
	for _, bad := range []string{`{"Item":{"a":{}}}`, `{"Item":{"a":{"S":"x","N":"1"}}}`, `{"a":{"S":"x"}}`, `{"Item":`, `[1]`} {
		if _, err := DecodeLine([]byte(bad)); err == nil {
			t.Errorf("DecodeLine(%s): no error", bad)
		}
	}
}

// TestDocumentedLayoutReportsAndReconciles reads exports in the layout AWS documents, with their
// manifests, spread over several data files (one of them empty, as for an empty partition).
func TestDocumentedLayoutReportsAndReconciles(t *testing.T) {
	ctx := context.Background()
	b := consistentBooks()
	root := t.TempDir()
	documentedExport(t, root, "kiln/2026-12-01/kiln-ledger", "kiln-ledger", b.ledger, 2)
	documentedExport(t, root, "kiln/2026-12-01/kiln-usage", "kiln-usage", b.usage, 2)
	documentedExport(t, root, "kiln/2026-12-01/kiln-aggregates", "kiln-aggregates", b.aggregates, 3)
	x, err := Open(ctx, filepath.Join(root, "kiln", "2026-12-01"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := x.Tables(); len(got) != 3 {
		t.Fatalf("tables %v, want ledger, usage, aggregates", got)
	}

	var sum money.Amount
	var n int
	inProgress, err := x.Records(ctx, "2026-11-29", "2026-11-30", "", func(r Record) error {
		n++
		sum += r.Cost
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 || inProgress != 1 || sum != 1_155_000+665_000+3_000_000+123_456_789_012 {
		t.Errorf("records: %d, in progress %d, cost %s", n, inProgress, sum)
	}
	n = 0
	if _, err := x.Records(ctx, "2026-11-30", "2026-11-30", "org_a", func(r Record) error { n++; return nil }); err != nil || n != 1 {
		t.Errorf("one organization's one day: %d records, %v", n, err)
	}

	res, err := x.Reconcile(ctx, Options{From: "2026-11-29", To: "2026-11-30"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Agrees || res.DifferenceCount != 0 || len(res.Rows) != 3 || res.InProgress != 1 {
		t.Fatalf("consistent books do not reconcile: %+v", res)
	}
	if r := res.Rows[0]; r.OrgID != "org_a" || r.Day != "2026-11-29" || r.Requests != 3 || r.Ledger != 4_820_000 ||
		r.Usage != 4_820_000 || r.Aggregates == nil || *r.Aggregates != 4_820_000 {
		t.Errorf("org_a on the 29th (the request over midnight counts on the day it started): %+v", r)
	}
}

// TestReconcileNamesWhatDiffers removes or alters one item at a time and checks that the
// reconciliation fails naming that generation, and only that.
func TestReconcileNamesWhatDiffers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(*books)
		want   []string // kind:generation
	}{
		{"a debit removed", func(b *books) { b.ledger = without(b.ledger, `"gen-01B"`) }, []string{UsageWithoutDebit + ":gen-01B"}},
		{"the debit over midnight removed", func(b *books) { b.ledger = without(b.ledger, `"gen-01C"`) }, []string{UsageWithoutDebit + ":gen-01C"}},
		{"a usage record removed", func(b *books) { b.usage = without(b.usage, `"gen-01E"`) }, []string{AggregatedWithoutUsage + ":gen-01E", DebitWithoutUsage + ":gen-01E"}},
		{"a debit off by a picodollar", func(b *books) {
			b.ledger = append(without(b.ledger, `"gen-01A"`), debitItem("org_a", "gen-01A", 1_155_001, day1.Add(10*3600e9)))
		}, []string{DebitDiffers + ":gen-01A"}},
		{"a marker missing", func(b *books) { b.aggregates = without(b.aggregates, `"gen#gen-01A"`) }, []string{NotAggregated + ":gen-01A"}},
		{"a roll-up off", func(b *books) {
			b.aggregates = append(without(b.aggregates, `"day#2026-11-30#qwen3-32b"`), rollupItem("org_b", "2026-11-30", "qwen3-32b", 1, 123_456_789_000))
		}, []string{RollupDiffers + ":"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := consistentBooks()
			tc.change(&b)
			root := t.TempDir()
			documentedExport(t, root, "p/ledger", "kiln-ledger", b.ledger, 100)
			documentedExport(t, root, "p/usage", "kiln-usage", b.usage, 100)
			documentedExport(t, root, "p/aggregates", "kiln-aggregates", b.aggregates, 100)
			x, err := Open(ctx, root, nil)
			if err != nil {
				t.Fatal(err)
			}
			// One partition and many: the spill files change nothing.
			for _, parts := range []int{1, 7} {
				res, err := x.Reconcile(ctx, Options{From: "2026-11-29", To: "2026-11-30", Partitions: parts})
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, d := range res.Differences {
					got = append(got, d.Kind+":"+d.GenerationID)
				}
				if res.Agrees || res.DifferenceCount != len(tc.want) || !slices.Equal(got, tc.want) {
					t.Fatalf("differences %v, want %v: %+v", got, tc.want, res)
				}
			}
		})
	}
}

// TestBareLayoutAsMotoWritesIt reads exports without manifests, every data file under the
// prefix, as moto writes them.
func TestBareLayoutAsMotoWritesIt(t *testing.T) {
	ctx := context.Background()
	b := consistentBooks()
	root := t.TempDir()
	bareExport(t, root, "p/kiln-ledger", b.ledger)
	bareExport(t, root, "p/kiln-usage", b.usage)
	x, err := Open(ctx, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := x.Reconcile(ctx, Options{From: "2026-11-29", To: "2026-11-30"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Agrees || res.Rows[0].Aggregates != nil {
		t.Errorf("ledger and usage alone reconcile, without aggregates: %+v", res)
	}
}

// TestBadExportsAreClearErrors: what a damaged, partial or foreign export gives.
func TestBadExportsAreClearErrors(t *testing.T) {
	ctx := context.Background()
	b := consistentBooks()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root string)
		want  string
	}{
		{"nothing there", func(t *testing.T, root string) {}, "no DynamoDB export"},
		{"damaged data file", func(t *testing.T, root string) {
			dir := documentedExport(t, root, "p", "kiln-usage", b.usage, 100)
			files, _ := filepath.Glob(filepath.Join(dir, "data", "*.json.gz"))
			write(t, files[len(files)-1], gz(t, b.usage[:2]))
		}, "items, the manifest says"},
		{"checksum", func(t *testing.T, root string) {
			dir := documentedExport(t, root, "p", "kiln-usage", b.usage, 100)
			files, _ := filepath.Glob(filepath.Join(dir, "data", "*.json.gz"))
			// The same items in other bytes: a gzip header's modification time (bytes 4-7) changed.
			data := gz(t, b.usage)
			data[4] ^= 0xff
			write(t, files[len(files)-1], data)
		}, "MD5"},
		{"missing data file", func(t *testing.T, root string) {
			dir := documentedExport(t, root, "p", "kiln-usage", b.usage, 100)
			files, _ := filepath.Glob(filepath.Join(dir, "data", "*.json.gz"))
			os.Remove(files[len(files)-1])
		}, "missing"},
		{"no files manifest", func(t *testing.T, root string) {
			dir := documentedExport(t, root, "p", "kiln-usage", b.usage, 100)
			os.Remove(filepath.Join(dir, "manifest-files.json"))
		}, "without manifest-files.json"},
		{"ion", func(t *testing.T, root string) {
			dir := documentedExport(t, root, "p", "kiln-usage", b.usage, 100)
			s, _ := os.ReadFile(filepath.Join(dir, "manifest-summary.json"))
			write(t, filepath.Join(dir, "manifest-summary.json"), []byte(strings.Replace(string(s), "DYNAMODB_JSON", "ION", 1)))
		}, "DYNAMODB_JSON"},
		{"two exports of one table", func(t *testing.T, root string) {
			documentedExport(t, root, "p/a", "kiln-usage", b.usage, 100)
			documentedExport(t, root, "p/b", "kiln-usage", b.usage[:3], 100)
		}, "two exports of the usage table"},
		{"not DynamoDB JSON", func(t *testing.T, root string) {
			write(t, filepath.Join(root, "p", "data", "x.json"), []byte(b.usage[0]+"\nnot json\n"))
		}, "line 2: not DynamoDB JSON"},
		{"two bare exports of one table", func(t *testing.T, root string) {
			bareExport(t, root, "p/1", b.ledger)
			bareExport(t, root, "p/2", b.ledger[:1])
		}, "two exports of the ledger table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			x, err := Open(ctx, root, nil)
			if err == nil {
				_, err = x.Records(ctx, "2026-11-01", "2026-11-30", "", func(Record) error { return nil })
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one that says %q", err, tc.want)
			}
		})
	}
	if _, err := Open(ctx, "s3://", nil); err == nil {
		t.Error("s3:// without a bucket: no error")
	}
	if _, err := Open(ctx, "gs://bucket/p", nil); err == nil {
		t.Error("gs://: no error")
	}
}
