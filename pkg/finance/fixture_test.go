package finance

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/usage"
)

// The fixtures here follow AWS's documentation of the export format ("DynamoDB table export
// output format"): PREFIX/AWSDynamoDB/EXPORT-ID/ holds manifest-summary.json (with its
// tableArn, exportTime, outputFormat, itemCount and manifestFilesS3Key), manifest-files.json in
// JSON lines (itemCount, md5Checksum in base64, etag, dataFileS3Key per data file), their
// .checksum files, an empty _started, and data/*.json.gz of one {"Item": {...}} per line.

// usageItem is a usage item as the DynamoDB store writes it (pkg/store/dynamo/settle.go).
func usageItem(org, gen, model string, started time.Time, cost int64, status string) string {
	return fmt.Sprintf(`{"Item":{"org_id":{"S":%q},"generation_id":{"S":%q},"version":{"N":"1"},"key_id":{"S":"kiln-AbC123xY"},`+
		`"model":{"S":%q},"endpoint":{"S":"/v1/chat/completions"},"stream":{"BOOL":true},"status":{"S":%q},"http_status":{"N":"200"},`+
		`"finish_reason":{"S":"stop"},"prompt_tokens":{"N":"9"},"cached_tokens":{"N":"0"},"completion_tokens":{"N":"12"},`+
		`"cost":{"N":"%d"},"cost_usd":{"S":"x"},"estimated":{"BOOL":false},"started_at":{"N":"%d"},"started_at_utc":{"S":%q},`+
		`"day":{"S":%q},"ttft_ms":{"N":"80"},"duration_ms":{"N":"400"},"backend":{"S":"b1"},"settled_at":{"N":"%d"},"settlement_token":{"S":"tok"}}}`,
		org, gen, model, status, cost, started.UnixNano(), started.UTC().Format(time.RFC3339Nano), started.UTC().Format(time.DateOnly), started.UnixNano()+1)
}

// debitItem is a ledger debit as settlement writes it, at the settlement's time.
func debitItem(org, gen string, cost int64, at time.Time) string {
	return fmt.Sprintf(`{"Item":{"org_id":{"S":%q},"entry_id":{"S":%q},"kind":{"S":"debit"},"amount":{"N":"%d"},"amount_usd":{"S":"x"},`+
		`"note":{"S":"gpt-oss-120b"},"at":{"N":"%d"},"at_utc":{"S":%q}}}`, org, gen, -cost, at.UnixNano(), at.UTC().Format(time.RFC3339Nano))
}

func topUpItem(org, id string, amount int64, at time.Time) string {
	return fmt.Sprintf(`{"Item":{"org_id":{"S":%q},"entry_id":{"S":%q},"kind":{"S":"top_up"},"amount":{"N":"%d"},"amount_usd":{"S":"x"},`+
		`"note":{"S":"=cmd"},"at":{"N":"%d"},"at_utc":{"S":"x"}}}`, org, id, amount, at.UnixNano())
}

func rollupItem(org, day, model string, requests, cost int64) string {
	return fmt.Sprintf(`{"Item":{"pk":{"S":%q},"sk":{"S":"day#%s#%s"},"org_id":{"S":%q},"day":{"S":%q},"model":{"S":%q},`+
		`"requests":{"N":"%d"},"prompt_tokens":{"N":"0"},"cached_tokens":{"N":"0"},"completion_tokens":{"N":"0"},"cost":{"N":"%d"}}}`,
		org, day, model, org, day, model, requests, cost)
}

func monthItem(org, month string, cost int64) string {
	return fmt.Sprintf(`{"Item":{"pk":{"S":%q},"sk":{"S":"month#%s"},"org_id":{"S":%q},"month":{"S":%q},"requests":{"N":"1"},`+
		`"prompt_tokens":{"N":"0"},"cached_tokens":{"N":"0"},"completion_tokens":{"N":"0"},"cost":{"N":"%d"}}}`, org, month, org, month, cost)
}

func markerItem(org, gen, day string, cost int64) string {
	return fmt.Sprintf(`{"Item":{"pk":{"S":"gen#%s"},"sk":{"S":%q},"org_id":{"S":%q},"generation_id":{"S":%q},"day":{"S":%q},"cost":{"N":"%d"}}}`,
		gen, org, org, gen, day, cost)
}

func gz(t testing.TB, lines []string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	for _, l := range lines {
		zw.Write([]byte(l + "\n"))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// documentedExport writes one table's export in the documented layout under root/prefix, its
// items spread over files of at most perFile items (an empty file too, as for an empty
// partition), and returns the export directory.
func documentedExport(t testing.TB, root, prefix, table string, items []string, perFile int) string {
	t.Helper()
	id := fmt.Sprintf("01764547200000-%08x", len(items)*7919+len(table))
	rel := prefix + "/AWSDynamoDB/" + id + "/"
	dir := filepath.Join(root, filepath.FromSlash(rel))
	var files bytes.Buffer
	chunks := [][]string{{}} // the empty partition
	for i := 0; i < len(items); i += perFile {
		chunks = append(chunks, items[i:min(i+perFile, len(items))])
	}
	for i, chunk := range chunks {
		data := gz(t, chunk)
		name := fmt.Sprintf("%026d.json.gz", i)
		write(t, filepath.Join(dir, "data", name), data)
		sum := md5.Sum(data)
		line, _ := json.Marshal(map[string]any{
			"itemCount": len(chunk), "md5Checksum": base64.StdEncoding.EncodeToString(sum[:]),
			"etag": fmt.Sprintf("%x-1", sum), "dataFileS3Key": rel + "data/" + name,
		})
		files.Write(append(line, '\n'))
	}
	summary, _ := json.MarshalIndent(map[string]any{
		"version": "2020-06-30", "exportArn": "arn:aws:dynamodb:us-east-1:123456789012:table/" + table + "/export/" + id,
		"startTime": "2026-12-01T00:00:00.000Z", "endTime": "2026-12-01T00:05:00.000Z",
		"tableArn": "arn:aws:dynamodb:us-east-1:123456789012:table/" + table, "tableId": "12345a12-abcd-123a-ab12-1234abc12345",
		"exportTime": "2026-12-01T00:00:00.000Z", "s3Bucket": "finance", "s3Prefix": prefix, "s3SseAlgorithm": "AES256",
		"s3SseKmsKeyId": nil, "manifestFilesS3Key": rel + "manifest-files.json", "billedSizeBytes": 0,
		"itemCount": len(items), "outputFormat": "DYNAMODB_JSON",
	}, "", "   ")
	write(t, filepath.Join(dir, "manifest-summary.json"), summary)
	write(t, filepath.Join(dir, "manifest-files.json"), files.Bytes())
	s1, s2 := md5.Sum(summary), md5.Sum(files.Bytes())
	write(t, filepath.Join(dir, "manifest-summary.checksum"), []byte(fmt.Sprintf("%x", s1)))
	write(t, filepath.Join(dir, "manifest-files.checksum"), []byte(fmt.Sprintf("%x", s2)))
	write(t, filepath.Join(dir, "_started"), nil)
	return dir
}

// bareExport writes one table's export as moto does: data/<uuid>.gz and no manifests.
func bareExport(t testing.TB, root, prefix string, items []string) string {
	t.Helper()
	dir := filepath.Join(root, filepath.FromSlash(prefix), "AWSDynamoDB", "fb91d765-a1de-4ee9-a8dd-2af5d0522b0f")
	write(t, filepath.Join(dir, "data", "efbf0679-2589-409b-8c5a-88c5f1a340b2.gz"), gz(t, items))
	return dir
}

var day1 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// books is a small, consistent set of books over two days and two organizations: every usage
// record with a cost has its debit and its marker, the roll-ups add up, and one request ran over
// midnight (started on the 29th, debited on the 30th).
type books struct{ ledger, usage, aggregates []string }

func consistentBooks() books {
	var b books
	type req struct {
		org, gen, model string
		started         time.Time
		cost            int64
		settled         time.Duration
	}
	reqs := []req{
		{"org_a", "gen-01A", "gpt-oss-120b", day1.Add(10 * time.Hour), 1_155_000, time.Second},
		{"org_a", "gen-01B", "qwen3-32b", day1.Add(11 * time.Hour), 665_000, time.Second},
		{"org_a", "gen-01C", "gpt-oss-120b", day1.Add(24*time.Hour - 2*time.Second), 3_000_000, 5 * time.Second}, // over midnight
		{"org_a", "gen-01D", "gpt-oss-120b", day1.Add(30 * time.Hour), 0, time.Second},                           // a rejected request: no debit
		{"org_b", "gen-01E", "qwen3-32b", day1.Add(36 * time.Hour), 123_456_789_012, time.Second},
	}
	rollups := map[[3]string][2]int64{}
	for _, r := range reqs {
		b.usage = append(b.usage, usageItem(r.org, r.gen, r.model, r.started, r.cost, "completed"))
		if r.cost > 0 {
			b.ledger = append(b.ledger, debitItem(r.org, r.gen, r.cost, r.started.Add(r.settled)))
		}
		day := r.started.Format(time.DateOnly)
		b.aggregates = append(b.aggregates, markerItem(r.org, r.gen, day, r.cost))
		k := [3]string{r.org, day, r.model}
		v := rollups[k]
		rollups[k] = [2]int64{v[0] + 1, v[1] + r.cost}
	}
	for k, v := range rollups {
		b.aggregates = append(b.aggregates, rollupItem(k[0], k[1], k[2], v[0], v[1]))
	}
	b.aggregates = append(b.aggregates, monthItem("org_a", "2026-11", 4_820_000))
	b.ledger = append(b.ledger, topUpItem("org_a", "top_1", 10_000_000_000_000, day1))
	// A request still running: not yet a usage record.
	b.usage = append(b.usage, usageItem("org_b", "gen-01F", "qwen3-32b", day1.Add(37*time.Hour), 0, string(usage.StatusInProgress)))
	return b
}

func without(items []string, substr string) []string {
	var out []string
	for _, it := range items {
		if !strings.Contains(it, substr) {
			out = append(out, it)
		}
	}
	return out
}
