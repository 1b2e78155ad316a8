package usage

import (
	"time"

	"github.com/oklog/ulid/v2"
)

// GenerationIDRange returns the least and the greatest generation id ("gen-" and a ULID) whose
// time lies in the milliseconds of from to to: a ULID begins with its millisecond time, so ids
// sort by it. The gateway's ids are ULIDs of the millisecond their request started, so this range
// holds the id of every request that started in [from, to] (the DynamoDB store's usage listings
// and finance's reads of the ledger by id rely on it).
func GenerationIDRange(from, to time.Time) (lo, hi string) {
	var a, b ulid.ULID
	_ = a.SetTime(ulid.Timestamp(from))
	_ = b.SetTime(ulid.Timestamp(to))
	for i := 6; i < len(b); i++ {
		b[i] = 0xff
	}
	return "gen-" + a.String(), "gen-" + b.String()
}
