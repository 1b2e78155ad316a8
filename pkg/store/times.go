package store

import (
	"errors"
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

// LeaseTTL returns ttl, or DefaultLeaseTTL when it is zero; a negative ttl is an error.
func LeaseTTL(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return DefaultLeaseTTL, nil
	case ttl < 0:
		return 0, fmt.Errorf("lease ttl %v: negative", ttl)
	}
	return ttl, nil
}

// Times checks an admission request and returns its time and the lease's expiry in Unix
// nanoseconds.
func (r AdmitRequest) Times() (now, expires int64, err error) {
	if r.OrgID == "" || r.HolderID == "" {
		return 0, 0, errors.New("empty organization or holder id")
	}
	ttl, err := LeaseTTL(r.TTL)
	if err != nil {
		return 0, 0, err
	}
	if now, err = UnixNanos("now", r.Now); err != nil {
		return 0, 0, err
	}
	if expires, err = UnixNanos("expiry", r.Now.Add(ttl)); err != nil {
		return 0, 0, err
	}
	return now, expires, nil
}
