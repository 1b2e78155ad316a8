package finance

import (
	"time"

	"github.com/oklog/ulid/v2"
)

// GenerationIDRange returns the least and the greatest generation id ("gen-" and a ULID) whose
// time lies in [from, to]: a ULID begins with its millisecond time, so ids sort by it.
func GenerationIDRange(from, to time.Time) (lo, hi string) {
	var a, b ulid.ULID
	_ = a.SetTime(ulid.Timestamp(from))
	_ = b.SetTime(ulid.Timestamp(to))
	for i := 6; i < len(b); i++ {
		b[i] = 0xff
	}
	return "gen-" + a.String(), "gen-" + b.String()
}
