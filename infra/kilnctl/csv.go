package main

import (
	"encoding/csv"
	"io"
	"regexp"
	"strings"
)

// writeCSV writes a header and rows as RFC 4180 CSV, every cell through csvCell. Every CSV that
// kilnctl writes goes through here.
func writeCSV(w io.Writer, header []string, rows [][]string) error {
	cw := csv.NewWriter(w)
	for _, row := range append([][]string{header}, rows...) {
		if err := cw.Write(safeCells(row)); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// safeCells returns the cells through csvCell, leaving the caller's slice (a package-level
// header, a row kept for another output) as it was.
func safeCells(cells []string) []string {
	safe := make([]string, len(cells))
	for i, s := range cells {
		safe[i] = csvCell(s)
	}
	return safe
}

// csvCell makes a cell safe to open in a spreadsheet (OWASP, "CSV Injection"): a cell that starts
// with =, +, -, @, a tab or a carriage return, which Excel, LibreOffice and Google Sheets would run
// as a formula, gets a single quote in front, which they show and do not run. encoding/csv then
// quotes the cell where CSV needs it (a comma, a quote, a line break).
//
// One exception, for finance: a cell that is a plain decimal number (-1.50, -0.000001155: an
// adjustment's amount) is left as it is, so that money columns stay numbers. A spreadsheet reads
// such a cell as a number, never as a formula; "-1+1", "-1.5e3" or "+1" are not plain and are
// escaped. Readers that undo the quote strip one leading "'" from a cell that had it.
func csvCell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) && !plainDecimal.MatchString(s) {
		return "'" + s
	}
	return s
}

// plainDecimal is an optional minus sign, digits, and optionally a point and more digits:
// "-1.50", "0", "12.000001155".
var plainDecimal = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)
