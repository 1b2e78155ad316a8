package main

import (
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/usage"
)

func TestCSVCell(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"qwen3-32b", "qwen3-32b"},
		{`=HYPERLINK("http://x","y")`, `'=HYPERLINK("http://x","y")`},
		{"+1+1", "'+1+1"},
		{"+1", "'+1"},
		{"-1+cmd|' /C calc'!A0", "'-1+cmd|' /C calc'!A0"},
		{"@SUM(A1)", "'@SUM(A1)"},
		{"\t=1", "'\t=1"},
		{"\r=1", "'\r=1"},
		{"-", "'-"},
		{"-1.5e3", "'-1.5e3"},
		{"-1.", "'-1."},
		{"-.5", "'-.5"},
		{"a=1", "a=1"},
		{"'quoted", "'quoted"},
		// Numbers stay numbers.
		{"-1.50", "-1.50"},
		{"-0.000001155", "-0.000001155"},
		{"0", "0"},
		{"12.5", "12.5"},
	} {
		if got := csvCell(tc.in); got != tc.want {
			t.Errorf("csvCell(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestCSVExportsEscapeFormulas puts formula-leading text where clients control it (the model id
// of a rejected request) and where operators write it (a ledger note), and reads both CSVs back.
func TestCSVExportsEscapeFormulas(t *testing.T) {
	e := newTestEnv(t)
	e.ok("org", "create", "--name", "Acme", "--id", "org_acme")
	e.ok("credits", "add", "--org", "org_acme", "--usd", "10", "--note", "@SUM(1+1)*cmd|' /C calc'!A0")
	e.ok("credits", "adjust", "--org", "org_acme", "--usd", "-1.50", "--note", "=1+1")
	formula := `=HYPERLINK("http://x","y")`
	seed(t, e.store(), []usage.Event{
		event("org_acme", "gen-f1", "2026-11-02T00:00:00Z", formula, usage.StatusRejected, 0, 0, 0, "0"),
		event("org_acme", "gen-f2", "2026-11-02T00:00:01Z", "+1+1", usage.StatusRejected, 0, 0, 0, "0"),
	})
	rows := readCSV(t, e.ok("usage", "--org", "org_acme", "--from", "2026-11-01", "--to", "2026-11-30", "--csv"))
	if len(rows) != 3 || rows[1][3] != "'"+formula || rows[2][3] != "'+1+1" {
		t.Errorf("events CSV: %q", rows)
	}
	rows = readCSV(t, e.ok("usage", "--org", "org_acme", "--from", "2026-11-01", "--to", "2026-11-30", "--by", "model", "--csv"))
	if len(rows) != 3 || rows[1][0] != "'+1+1" || rows[2][0] != "'"+formula {
		t.Errorf("by model CSV: %q", rows)
	}
	rows = readCSV(t, e.ok("credits", "ledger", "--org", "org_acme", "--csv"))
	var notes, amounts []string
	for _, r := range rows[1:] {
		amounts, notes = append(amounts, r[3]), append(notes, r[4])
	}
	if got := strings.Join(notes, " | "); !strings.Contains(got, "'@SUM(1+1)") || !strings.Contains(got, "'=1+1") {
		t.Errorf("ledger notes: %q", notes)
	}
	if got := strings.Join(amounts, " "); !strings.Contains(got, "-1.5") || strings.Contains(got, "'") {
		t.Errorf("ledger amounts must stay numbers: %q", amounts)
	}
}

// TestWriteCSVLeavesItsInput: the cells are escaped in what is written, not in the caller's
// slices, so that a header or row written twice is escaped once each time.
func TestWriteCSVLeavesItsInput(t *testing.T) {
	header, row := []string{"=h"}, []string{"@r"}
	for range 2 {
		var b strings.Builder
		if err := writeCSV(&b, header, [][]string{row}); err != nil {
			t.Fatal(err)
		}
		if b.String() != "'=h\n'@r\n" {
			t.Errorf("wrote %q", b.String())
		}
	}
	if header[0] != "=h" || row[0] != "@r" {
		t.Errorf("the input became %q, %q", header, row)
	}
}
