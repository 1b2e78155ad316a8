package main

import "testing"

func TestCSVCellEscapesFormulasButNotNumbers(t *testing.T) {
	for in, want := range map[string]string{
		"":                "",
		"gpt-oss-120b":    "gpt-oss-120b",
		"=HYPERLINK(1)":   "'=HYPERLINK(1)",
		"+1+1":            "'+1+1",
		"+1":              "'+1",
		"-1+2":            "'-1+2",
		"@SUM(A1)":        "'@SUM(A1)",
		"\tcmd":           "'\tcmd",
		"\rcmd":           "'\rcmd",
		"-1.50":           "-1.50",
		"-0.000001155":    "-0.000001155",
		"0.000001155":     "0.000001155",
		"-":               "'-",
		"-.5":             "'-.5",
		"-1.":             "'-1.",
		"-1e3":            "'-1e3",
		"note = fine":     "note = fine",
		"org_acme":        "org_acme",
		"-1.50 refund":    "'-1.50 refund",
		"2026-11-29":      "2026-11-29",
		"-2026-11-29":     "'-2026-11-29",
		"=1":              "'=1",
		"gen-01JDZ8K3W6Q": "gen-01JDZ8K3W6Q",
	} {
		if got := csvCell(in); got != want {
			t.Errorf("csvCell(%q) = %q, want %q", in, got, want)
		}
	}
}
