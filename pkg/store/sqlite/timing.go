package sqlite

import (
	"database/sql"
	"fmt"
	"time"
)

// nanos converts a time that must be present to Unix nanoseconds. Times outside what an int64
// of nanoseconds can hold (years 1678 to 2262), the zero time among them, are refused rather
// than silently wrapped.
func nanos(what string, t time.Time) (int64, error) {
	if y := t.Year(); y < 1678 || y > 2261 {
		return 0, fmt.Errorf("%s %v: outside the storable range", what, t)
	}
	return t.UnixNano(), nil
}

// optNanos is nanos for a time that may be absent: the zero time is stored as NULL.
func optNanos(what string, t time.Time) (sql.NullInt64, error) {
	if t.IsZero() {
		return sql.NullInt64{}, nil
	}
	n, err := nanos(what, t)
	return sql.NullInt64{Int64: n, Valid: err == nil}, err
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

func fromOptNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromNanos(n.Int64)
}
