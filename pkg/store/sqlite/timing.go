package sqlite

import (
	"database/sql"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// optNanos is store.UnixNanos for a time that may be absent: the zero time is stored as NULL.
func optNanos(what string, t time.Time) (sql.NullInt64, error) {
	if t.IsZero() {
		return sql.NullInt64{}, nil
	}
	n, err := store.UnixNanos(what, t)
	return sql.NullInt64{Int64: n, Valid: err == nil}, err
}

func fromOptNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return store.FromUnixNanos(n.Int64)
}
