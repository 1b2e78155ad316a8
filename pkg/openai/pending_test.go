package openai

import (
	"io"
	"testing"
)

func TestPending(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  string
		pending []bool // Pending after each Next
	}{
		{"two events in one read", "data: a\n\ndata: b\n\n", []bool{true, false}},
		{"the second is incomplete", "data: a\n\ndata: b", []bool{false}},
		{"CRLF", "data: a\r\n\r\ndata: b\r\n\r\n", []bool{true, false}},
		{"CR", "data: a\r\rdata: b\r\r", []bool{true, false}},
		{"LF then CRLF", "data: a\n\ndata: b\n\r\n", []bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			go func() { _, _ = pw.Write([]byte(tc.stream)) }() // one write: everything arrives in one read
			d := NewDecoder(pr)
			for i, want := range tc.pending {
				if _, err := d.Next(); err != nil {
					t.Fatal(err)
				}
				if got := d.Pending(); got != want {
					t.Fatalf("after event %d: Pending = %v, want %v", i, got, want)
				}
			}
			pw.Close()
		})
	}
}
