package store

import (
	"fmt"
	"time"
)

// UnixNanos converts a time a store keeps to Unix nanoseconds, the unit both stores keep times
// in so that ordering and comparisons are exact. Times outside what an int64 of nanoseconds can
// hold (years 1678 to 2261), the zero time among them, are refused rather than silently wrapped.
func UnixNanos(what string, t time.Time) (int64, error) {
	if y := t.Year(); y < 1678 || y > 2261 {
		return 0, fmt.Errorf("%s %v: outside the storable range", what, t)
	}
	return t.UnixNano(), nil
}

// FromUnixNanos is the UTC time of a count of Unix nanoseconds.
func FromUnixNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// OptUnixNanos is UnixNanos for a time that may be absent: the zero time is nil.
func OptUnixNanos(what string, t time.Time) (*int64, error) {
	if t.IsZero() {
		return nil, nil
	}
	n, err := UnixNanos(what, t)
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// FromOptUnixNanos is FromUnixNanos for a time that may be absent: nil is the zero time.
func FromOptUnixNanos(n *int64) time.Time {
	if n == nil {
		return time.Time{}
	}
	return FromUnixNanos(*n)
}

// UnixNanosRange converts the bounds of a range of times, [from, to), to Unix nanoseconds.
func UnixNanosRange(from, to time.Time) (f, t int64, err error) {
	if f, err = UnixNanos("from", from); err != nil {
		return 0, 0, err
	}
	if t, err = UnixNanos("to", to); err != nil {
		return 0, 0, err
	}
	return f, t, nil
}

// LeaseTimes returns now and the expiry of a lease taken or renewed at now for ttl
// (DefaultLeaseTTL when zero; a negative ttl is an error), in Unix nanoseconds.
func LeaseTimes(now time.Time, ttl time.Duration) (n, expires int64, err error) {
	switch {
	case ttl == 0:
		ttl = DefaultLeaseTTL
	case ttl < 0:
		return 0, 0, fmt.Errorf("lease ttl %v: negative", ttl)
	}
	if n, err = UnixNanos("now", now); err != nil {
		return 0, 0, err
	}
	if expires, err = UnixNanos("expiry", now.Add(ttl)); err != nil {
		return 0, 0, err
	}
	return n, expires, nil
}
