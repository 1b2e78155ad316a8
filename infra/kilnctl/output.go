package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/neocloud/kiln/pkg/money"
)

// writeJSON writes v as one indented JSON document. Money is a decimal string (money.Amount's
// MarshalJSON), times are RFC 3339 in UTC.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned text columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = oneLine(c) // a tab or newline in a note would break the columns
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// oneLine keeps a value from breaking a text line.
func oneLine(s string) string { return strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(s) }

func (t *table) flush() error { return t.tw.Flush() }

// exactTime is the form of times in CSV: RFC 3339 with nanoseconds, UTC.
func exactTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// shortTime is the form of times in text tables.
func shortTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// usd is the form of money in text output and of prices on the Models page: at least two
// decimal places, more when needed to stay exact ("10.00", "0.000001155", "0.0175").
func usd(a money.Amount) string { return a.Fixed(2) }

// orNone shows an empty value in text output.
func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// idAlphabet is Crockford's base32 in lower case: no i, l, o or u to misread.
const idAlphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// newID returns prefix and 20 random base32 characters (100 bits).
func newID(prefix string) string {
	b := make([]byte, 20)
	rand.Read(b) // never fails: crypto/rand crashes the program instead
	for i := range b {
		b[i] = idAlphabet[b[i]&31]
	}
	return prefix + string(b)
}
