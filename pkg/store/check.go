package store

import (
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/usage"
)

// What every store refuses before it reads or writes anything, so that both refuse alike.

// Wrapf wraps a non-nil err with the operation and key that format and args name, as in "admit
// org-a: in-flight limit reached", the form of every error a store returns; nil stays nil.
func Wrapf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// CheckOrg refuses what no store keeps for an organization: a status other than active or
// suspended, or an in-flight limit below 1.
func CheckOrg(status OrgStatus, maxInFlight int) error {
	if status != OrgActive && status != OrgSuspended {
		return fmt.Errorf("unknown status %q", status)
	}
	if maxInFlight < 1 {
		return fmt.Errorf("max in flight %d: must be at least 1", maxInFlight)
	}
	return nil
}

// NewOrg returns org as CreateOrg stores it, and its creation time in Unix nanoseconds (nil
// when unset): a zero MaxInFlight means DefaultMaxInFlight and an empty Status active. It
// refuses an empty ID, a balance other than zero (credits arrive only through the ledger), what
// CheckOrg refuses and a creation time no store can keep.
func NewOrg(org Org) (Org, *int64, error) {
	switch {
	case org.ID == "":
		return Org{}, nil, errors.New("empty id")
	case org.Balance != 0:
		return Org{}, nil, errors.New("a new organization's balance is zero; add credits with a ledger entry")
	}
	if org.MaxInFlight == 0 {
		org.MaxInFlight = DefaultMaxInFlight
	}
	if org.Status == "" {
		org.Status = OrgActive
	}
	if err := CheckOrg(org.Status, org.MaxInFlight); err != nil {
		return Org{}, nil, err
	}
	created, err := OptUnixNanos("created_at", org.CreatedAt)
	return org, created, err
}

// CheckNewKey refuses a key that CreateKey does not store — one without an ID, revoked, or
// created at a time no store can keep — and returns its creation time in Unix nanoseconds (nil
// when unset).
func CheckNewKey(key Key) (created *int64, err error) {
	switch {
	case key.ID == "":
		return nil, errors.New("empty id")
	case key.RevokedAt != nil:
		return nil, errors.New("a new key cannot be revoked")
	}
	return OptUnixNanos("created_at", key.CreatedAt)
}

// CheckEntry refuses a ledger entry that AddEntry does not apply — one without an ID or an
// organization, a top-up that is not positive, an adjustment of zero, any other kind (debits
// come only from settlements), or a time no store can keep — and returns its time in Unix
// nanoseconds.
func CheckEntry(e LedgerEntry) (at int64, err error) {
	if e.ID == "" || e.OrgID == "" {
		return 0, errors.New("empty id")
	}
	switch e.Kind {
	case EntryTopUp:
		if e.Amount <= 0 {
			return 0, fmt.Errorf("a top-up of %s: must be positive", e.Amount)
		}
	case EntryAdjustment:
		if e.Amount == 0 {
			return 0, errors.New("an adjustment of zero")
		}
	default:
		return 0, fmt.Errorf("kind %q: only top-ups and adjustments are added directly", e.Kind)
	}
	return UnixNanos("at", e.At)
}

// Times checks an admission request — an organization and a holder, a reservation not below
// zero — and returns its time and the lease's expiry in Unix nanoseconds (LeaseTimes).
func (r AdmitRequest) Times() (now, expires int64, err error) {
	switch {
	case r.OrgID == "" || r.HolderID == "":
		return 0, 0, errors.New("empty organization or holder id")
	case r.Reserve < 0:
		return 0, 0, fmt.Errorf("negative reservation %s", r.Reserve)
	}
	return LeaseTimes(r.Now, r.TTL)
}

// Refusal is why an organization cannot admit one more request, in the contract's order: a
// status other than active is ErrSuspended; less available than the reservation, or nothing,
// ErrInsufficientCredits; held leases at the limit or above, ErrSlotsFull. It is nil when the
// request fits.
func Refusal(status OrgStatus, available, reserve money.Amount, held, limit int) error {
	switch {
	case status != OrgActive:
		return ErrSuspended
	case available < reserve || available <= 0:
		return ErrInsufficientCredits
	case held >= limit:
		return ErrSlotsFull
	}
	return nil
}

// Check refuses a settlement that no store applies — an event without an organization or a
// generation id, a lease of another organization, a negative cost — and returns its time in
// Unix nanoseconds.
func (s Settlement) Check() (now int64, err error) {
	e := s.Event
	switch {
	case e.OrgID == "" || e.GenerationID == "":
		return 0, errors.New("event without organization or generation id")
	case s.Lease.OrgID != "" && s.Lease.OrgID != e.OrgID:
		return 0, fmt.Errorf("lease of organization %s", s.Lease.OrgID)
	case e.Cost < 0:
		return 0, fmt.Errorf("negative cost %s", e.Cost)
	}
	return UnixNanos("now", s.Now)
}

// CheckDelta refuses a delta that Fold cannot key its marker and roll-ups by: one without an
// organization, a generation id, a day or a month.
func CheckDelta(d usage.Delta) error {
	if d.OrgID == "" || d.GenerationID == "" || d.Day == "" || d.Month == "" {
		return fmt.Errorf("fold %s of %s: incomplete delta", d.GenerationID, d.OrgID)
	}
	return nil
}
