package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// Admit checks the organization and takes an in-flight slot in one write transaction: the
// organization must be active with a balance above zero and fewer unexpired leases than its
// limit. Expired leases are not counted, and are deleted when an admission finds them, so
// crashed holders leave nothing behind.
// A holder ID that already holds a slot is refused with ErrExists.
func (s *Store) Admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	lease, err := s.admit(ctx, req)
	return lease, store.Wrapf(err, "admit %s", req.OrgID)
}

func (s *Store) admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	now, expires, err := req.Times()
	if err != nil {
		return store.Lease{}, err
	}
	if s.slots != nil {
		return s.admitInMemory(ctx, req, now, expires)
	}
	var full bool
	err = s.writeChecked(ctx, func(ctx context.Context, tx *sql.Tx) error {
		full = false
		var (
			status            string
			balance, reserved int64
			limit             int
			held, expired     int
		)
		err := s.stmt(ctx, tx, s.st.admitCheck).QueryRowContext(ctx, req.OrgID, now).
			Scan(&status, &balance, &limit, &held, &expired, &reserved)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return refuse(store.ErrNotFound)
		case err != nil:
			return err
		}
		refusal := store.Refusal(store.OrgStatus(status), money.Amount(balance-reserved), req.Reserve, held, limit)
		if refusal != nil && !errors.Is(refusal, store.ErrSlotsFull) {
			return refuse(refusal)
		}
		if expired > 0 {
			// Crashed holders' leases are deleted once seen, so that they do not pile up
			// and an expired holder ID can be admitted again.
			if _, err := s.stmt(ctx, tx, s.st.admitPurge).ExecContext(ctx, req.OrgID, now); err != nil {
				return err
			}
		}
		if refusal != nil {
			// Full slots are not an error for the writer, so that the purge above is kept.
			full = true
			return nil
		}
		res, err := s.stmt(ctx, tx, s.st.admitInsert).ExecContext(ctx, req.OrgID, req.HolderID, expires, int64(req.Reserve))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			// The insert changed nothing; the purge may stand.
			return refuse(fmt.Errorf("holder %s: %w", req.HolderID, store.ErrExists))
		}
		return nil
	})
	switch {
	case err != nil:
		return store.Lease{}, err
	case full:
		return store.Lease{}, store.ErrSlotsFull
	}
	return store.Lease{OrgID: req.OrgID, HolderID: req.HolderID, Expires: store.FromUnixNanos(expires), Reserved: req.Reserve}, nil
}

// admitInMemory is admit for a Store with OwnSlots: the organization's row (kept for orgTTL) is
// checked in the same order, and the slot taken in memory.
func (s *Store) admitInMemory(ctx context.Context, req store.AdmitRequest, now, expires int64) (store.Lease, error) {
	org, version, ok := s.orgs.get(req.OrgID, time.Now())
	if !ok {
		var err error
		if org, err = s.readAdmitRow(ctx, req.OrgID); err != nil {
			return store.Lease{}, err
		}
		s.orgs.put(req.OrgID, org, version)
	}
	if org.status != store.OrgActive {
		return store.Lease{}, store.ErrSuspended
	}
	if err := s.slots.admit(req.OrgID, req.HolderID, org.limit, org.balance, int64(req.Reserve), now, expires); err != nil {
		return store.Lease{}, err
	}
	return store.Lease{OrgID: req.OrgID, HolderID: req.HolderID, Expires: store.FromUnixNanos(expires), Reserved: req.Reserve}, nil
}

// readAdmitRow reads what admission reads of an organization; store.ErrNotFound when there is
// none.
func (s *Store) readAdmitRow(ctx context.Context, orgID string) (admitRow, error) {
	var (
		r      admitRow
		status string
	)
	err := s.st.admitOrg.QueryRowContext(ctx, orgID).Scan(&status, &r.balance, &r.limit)
	if errors.Is(err, sql.ErrNoRows) {
		return admitRow{}, store.ErrNotFound
	}
	r.status, r.read = store.OrgStatus(status), time.Now()
	return r, err
}

// Release removes a lease, and with it its reservation, if it is held.
func (s *Store) Release(ctx context.Context, lease store.Lease) (bool, error) {
	if s.slots != nil {
		return s.slots.release(lease.OrgID, lease.HolderID), nil
	}
	err := s.update(ctx, store.ErrLeaseLost, `DELETE FROM leases WHERE org_id = ? AND holder_id = ?`, lease.OrgID, lease.HolderID)
	if errors.Is(err, store.ErrLeaseLost) {
		return false, nil
	}
	return err == nil, store.Wrapf(err, "release %s of %s", lease.HolderID, lease.OrgID)
}

// Renew extends an unexpired lease to now+ttl (store.DefaultLeaseTTL when ttl is zero);
// ErrLeaseLost when the lease was released or had expired by now.
func (s *Store) Renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	renewed, err := s.renew(ctx, lease, now, ttl)
	return renewed, store.Wrapf(err, "renew %s of %s", lease.HolderID, lease.OrgID)
}

func (s *Store) renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	n, expires, err := store.LeaseTimes(now, ttl)
	if err != nil {
		return store.Lease{}, err
	}
	if s.slots != nil {
		err = s.slots.renew(lease.OrgID, lease.HolderID, n, expires)
	} else {
		err = s.update(ctx, store.ErrLeaseLost, `UPDATE leases SET expires_at = ? WHERE org_id = ? AND holder_id = ? AND expires_at > ?`,
			expires, lease.OrgID, lease.HolderID, n)
	}
	if err != nil {
		return store.Lease{}, err
	}
	lease.Expires = store.FromUnixNanos(expires)
	return lease, nil
}

// InFlight lists the organization's unexpired leases at now, by holder ID.
func (s *Store) InFlight(ctx context.Context, orgID string, now time.Time) ([]store.Lease, error) {
	n, err := store.UnixNanos("now", now)
	if err != nil {
		return nil, fmt.Errorf("in flight of %s: %w", orgID, err)
	}
	if s.slots != nil {
		if _, err := s.Org(ctx, orgID); err != nil {
			return nil, fmt.Errorf("in flight of %s: %w", orgID, err)
		}
		return s.slots.inFlight(orgID, n), nil
	}
	leases, err := listOrg(ctx, s, orgID, func(row scanner) (store.Lease, error) {
		l := store.Lease{OrgID: orgID}
		var expires int64
		err := row.Scan(&l.HolderID, &expires)
		l.Expires = store.FromUnixNanos(expires)
		return l, err
	}, `SELECT holder_id, expires_at FROM leases WHERE org_id = ? AND expires_at > ? ORDER BY holder_id`, orgID, n)
	return leases, store.Wrapf(err, "in flight of %s", orgID)
}
