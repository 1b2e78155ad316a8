package main

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/neocloud/kiln/pkg/config"
)

// financeExportDir writes a bare export (as moto writes them: data/*.gz, no manifests) of the
// ledger and usage items given, and returns its directory.
func financeExportDir(t *testing.T, ledger, usage []string) string {
	t.Helper()
	root := t.TempDir()
	for name, items := range map[string][]string{"kiln-ledger": ledger, "kiln-usage": usage} {
		path := filepath.Join(root, name, "AWSDynamoDB", "0000", "data", "part.gz")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		zw := gzip.NewWriter(f)
		for _, it := range items {
			fmt.Fprintln(zw, it)
		}
		zw.Close()
		f.Close()
	}
	return root
}

func financeUsage(org, gen, model, backend string, started time.Time, cost int64) string {
	return fmt.Sprintf(`{"Item":{"org_id":{"S":%q},"generation_id":{"S":%q},"version":{"N":"1"},"key_id":{"S":"kiln-AbC123xY"},`+
		`"model":{"S":%q},"endpoint":{"S":"/v1/completions"},"stream":{"BOOL":false},"status":{"S":"completed"},"http_status":{"N":"200"},`+
		`"finish_reason":{"S":"length"},"prompt_tokens":{"N":"5"},"cached_tokens":{"N":"1"},"completion_tokens":{"N":"7"},`+
		`"cost":{"N":"%d"},"cost_usd":{"S":"x"},"estimated":{"BOOL":true},"started_at":{"N":"%d"},"day":{"S":%q},`+
		`"ttft_ms":{"N":"3"},"duration_ms":{"N":"9"},"backend":{"S":%q},"settled_at":{"N":"1"}}}`,
		org, gen, model, cost, started.UnixNano(), started.UTC().Format(time.DateOnly), backend)
}

func financeDebit(org, gen string, cost int64, at time.Time) string {
	return fmt.Sprintf(`{"Item":{"org_id":{"S":%q},"entry_id":{"S":%q},"kind":{"S":"debit"},"amount":{"N":"%d"},"at":{"N":"%d"}}}`,
		org, gen, -cost, at.UnixNano())
}

func TestFinanceReportAndReconcileOfAnExportDirectory(t *testing.T) {
	e := newTestEnv(t)
	day := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	usage := []string{
		financeUsage("org_a", "gen-01A", "gpt-oss-120b", "=HYPERLINK(\"http://x\")", day, 665_000),
		financeUsage("org_a", "gen-01B", "qwen3-32b", "b1", day.Add(time.Hour), 1_155_000),
		financeUsage("org_b", "gen-01C", "qwen3-32b", "b1", day.Add(24*time.Hour), 2_000_000_000_000),
		financeUsage("org_b", "gen-01D", "qwen3-32b", "b1", day.Add(72*time.Hour), 5), // after --to
	}
	ledger := []string{
		financeDebit("org_a", "gen-01A", 665_000, day.Add(time.Second)),
		financeDebit("org_a", "gen-01B", 1_155_000, day.Add(time.Hour+time.Second)),
		financeDebit("org_b", "gen-01C", 2_000_000_000_000, day.Add(24*time.Hour+time.Second)),
	}
	dir := financeExportDir(t, ledger, usage)

	// The list: the columns of kilnctl usage --csv, money exact, cells safe for spreadsheets.
	rows := readCSV(t, e.ok("finance", "report", "--export", dir, "--from", "2026-11-29", "--to", "2026-11-30", "--csv"))
	if !slices.Equal(rows[0], eventColumns) || len(rows) != 4 {
		t.Fatalf("report --csv:\n%v", rows)
	}
	byGen := map[string][]string{}
	for _, r := range rows[1:] {
		byGen[r[0]] = r
	}
	if r := byGen["gen-01A"]; r[12] != "0.000000665" || r[17] != `'=HYPERLINK("http://x")` || r[13] != "true" || r[14] != "2026-11-29T12:00:00Z" {
		t.Errorf("gen-01A row: %q", r)
	}
	if r := byGen["gen-01C"]; r[12] != "2" {
		t.Errorf("gen-01C cost %q, want 2", r[12])
	}

	// Roll-ups, per day, model and organization.
	rows = readCSV(t, e.ok("finance", "report", "--export", dir, "--from", "2026-11-29", "--to", "2026-11-30", "--by", "org", "--csv"))
	want := [][]string{
		{"org", "requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost"},
		{"org_a", "2", "10", "2", "14", "0.00000182"},
		{"org_b", "1", "5", "1", "7", "2"},
	}
	if !slices.EqualFunc(rows, want, slices.Equal) {
		t.Errorf("--by org:\n%v\nwant\n%v", rows, want)
	}
	type totals struct {
		Requests         int    `json:"requests"`
		PromptTokens     int    `json:"prompt_tokens"`
		CachedTokens     int    `json:"cached_tokens"`
		CompletionTokens int    `json:"completion_tokens"`
		Cost             string `json:"cost"`
	}
	var byDay struct {
		From, To, By string
		Rows         []struct {
			Key string `json:"key"`
			totals
		} `json:"rows"`
		Total totals `json:"total"`
	}
	e.json(&byDay, "finance", "report", "--export", dir, "--from", "2026-11-29", "--to", "2026-12-02", "--by", "day")
	if len(byDay.Rows) != 3 || byDay.Rows[2].Key != "2026-12-02" || byDay.Total.Requests != 4 || byDay.Total.Cost != "2.000001820005" {
		t.Errorf("--by day --json: %+v", byDay)
	}
	var list []json.RawMessage
	e.json(&list, "finance", "report", "--export", dir, "--from", "2026-11-30", "--to", "2026-11-30")
	if len(list) != 1 || !strings.Contains(string(list[0]), `"cost":"2"`) {
		t.Errorf("report --json: %s", list)
	}
	if out := e.ok("finance", "report", "--export", dir, "--from", "2026-11-29", "--to", "2026-11-29", "--org", "org_a"); !strings.Contains(out, "2 requests, 0.00000182 USD") {
		t.Errorf("report text:\n%s", out)
	}

	// Reconcile: agrees, exit 0.
	out := e.ok("finance", "reconcile", "--export", dir, "--from", "2026-11-29", "--to", "2026-11-30")
	if !strings.Contains(out, "every figure agrees") {
		t.Errorf("reconcile:\n%s", out)
	}

	// One debit missing: exit 3, naming the generation.
	bad := financeExportDir(t, ledger[1:], usage)
	code, stdout, stderr := e.run("finance", "reconcile", "--export", bad, "--from", "2026-11-29", "--to", "2026-11-30")
	if code != exitDiffers || !strings.Contains(stdout, "usage_without_debit") || !strings.Contains(stdout, "gen-01A") ||
		!strings.Contains(stdout, "DIFFERS") || !strings.Contains(stderr, "differ") {
		t.Errorf("reconcile of books with a debit missing: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, _ = e.run("finance", "reconcile", "--export", bad, "--from", "2026-11-29", "--to", "2026-11-30", "--json")
	var res struct {
		Agrees      bool `json:"agrees"`
		Differences []struct {
			Kind         string  `json:"kind"`
			GenerationID string  `json:"generation_id"`
			Ledger       *string `json:"ledger"`
			Usage        *string `json:"usage"`
		} `json:"differences"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || code != exitDiffers || res.Agrees || len(res.Differences) != 1 ||
		res.Differences[0].GenerationID != "gen-01A" || res.Differences[0].Ledger != nil || *res.Differences[0].Usage != "0.000000665" {
		t.Errorf("reconcile --json: exit %d, %v\n%s", code, err, stdout)
	}
}

func TestFinanceCommandsRefuseBadInput(t *testing.T) {
	e := newTestEnv(t)
	dir := financeExportDir(t, nil, nil)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"finance", "report", "--from", "2026-11-01", "--to", "2026-11-30"}, 2, "--export is required"},
		{[]string{"finance", "report", "--export", dir, "--from", "2026-11-30", "--to", "2026-11-01"}, 2, "before"},
		{[]string{"finance", "report", "--export", dir, "--from", "2026-11", "--to", "2026-11-30"}, 2, "--from"},
		{[]string{"finance", "report", "--export", dir, "--from", "2026-11-01", "--to", "2026-11-30", "--by", "week"}, 2, "--by"},
		{[]string{"finance", "report", "--export", filepath.Join(dir, "missing"), "--from", "2026-11-01", "--to", "2026-11-30"}, 1, "no such file"},
		{[]string{"finance", "report", "--export", "gs://b/p", "--from", "2026-11-01", "--to", "2026-11-30"}, 1, "s3://BUCKET/PREFIX"},
		{[]string{"finance", "reconcile", "--export", dir, "--from", "2026-11-01"}, 2, "--to"},
		{[]string{"finance", "export", "--prefix", "p"}, 2, "--bucket is required"},
		{[]string{"finance", "export", "--bucket", "s3://b", "--prefix", "p"}, 2, "without s3://"},
		{[]string{"finance", "export", "--bucket", "b"}, 2, "--prefix is required"},
		{[]string{"finance", "export", "--bucket", "b", "--prefix", "p", "--at", "yesterday"}, 2, "--at"},
		{[]string{"finance", "export", "--bucket", "b", "--prefix", "p", "--at", "2999-01-01T00:00:00Z"}, 2, "future"},
		{[]string{"finance", "export", "--bucket", "b", "--prefix", "p"}, 1, "KILN_STORE=dynamodb"},
	} {
		code, _, stderr := e.run(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("kilnctl %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, stderr, tc.code, tc.want)
		}
	}
	// An empty export of both tables is an empty report, not an error.
	if out := e.ok("finance", "report", "--export", dir, "--from", "2026-11-01", "--to", "2026-11-30", "--csv"); strings.Count(out, "\n") != 1 {
		t.Errorf("empty report:\n%s", out)
	}
	_ = config.StoreSQLite
}
