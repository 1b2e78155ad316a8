package usage

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// TestGenerationIDRange: the range of [from, to] holds the ids of every millisecond from from's
// to to's, whatever their random part, and no id of the milliseconds around them.
func TestGenerationIDRange(t *testing.T) {
	from := time.Date(2026, 11, 29, 12, 0, 0, 123_456_789, time.UTC)
	to := from.Add(2*time.Second + 500*time.Microsecond)
	lo, hi := GenerationIDRange(from, to)
	id := func(at time.Time, entropy byte) string {
		var u ulid.ULID
		if err := u.SetTime(ulid.Timestamp(at)); err != nil {
			t.Fatal(err)
		}
		for i := 6; i < len(u); i++ {
			u[i] = entropy
		}
		return "gen-" + u.String()
	}
	for _, tc := range []struct {
		name string
		id   string
		in   bool
	}{
		{"from's millisecond, least", id(from, 0), true},
		{"from's millisecond, its own start", id(from.Truncate(time.Millisecond), 0), true},
		{"to's millisecond, greatest", id(to, 0xff), true},
		{"between, random", "gen-" + ulid.MustNew(ulid.Timestamp(from.Add(time.Second)), rand.Reader).String(), true},
		{"the millisecond before from", id(from.Add(-time.Millisecond), 0xff), false},
		{"the millisecond after to", id(to.Add(time.Millisecond), 0), false},
	} {
		if in := lo <= tc.id && tc.id <= hi; in != tc.in {
			t.Errorf("%s: %s in [%s, %s] = %v, want %v", tc.name, tc.id, lo, hi, in, tc.in)
		}
	}
}
