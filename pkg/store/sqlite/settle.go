package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// errApplied rolls back a settlement whose generation was already settled.
var errApplied = errors.New("already applied")

// Settle releases the lease, debits the event's cost and records the event in one write
// transaction. The usage row, keyed by organization and generation id, makes a replay change
// nothing. A debit entry (ID = generation id, amount = -cost) is written only for a non-zero
// cost, so rejected requests do not fill the ledger with zero entries. The same transaction folds
// the event into the aggregates and marks the usage row folded. (The unpublished_since column,
// the outbox of a publisher that no longer exists, is left NULL.)
//
// The debit is capped at the balance less the reservations of the organization's other unexpired
// leases (the request's own reservation covers it while its lease is held), so that it never
// takes the balance below zero nor what other requests in flight reserved.
func (s *Store) Settle(ctx context.Context, st store.Settlement) (store.SettleResult, error) {
	e := st.Event
	var off money.Amount
	err := s.settle(ctx, &st, &off)
	if errors.Is(err, errApplied) {
		return store.SettleResult{AlreadyApplied: true}, nil
	}
	if err != nil {
		return store.SettleResult{}, fmt.Errorf("settle %s of %s: %w", e.GenerationID, e.OrgID, err)
	}
	return store.SettleResult{WrittenOff: off}, nil
}

// settle writes the settlement; *off is set to what of the cost was written off. st.Event.Cost
// is the debited cost afterwards.
func (s *Store) settle(ctx context.Context, st *store.Settlement, off *money.Amount) (err error) {
	e := &st.Event // the write below keeps st: a copy of the event would be kept too
	now, err := st.Check()
	if err != nil {
		return err
	}
	started, err := store.UnixNanos("started_at", e.StartedAt)
	if err != nil {
		return err
	}
	cost := e.Cost
	if s.slots != nil {
		var read int64
		if read, err = s.balanceToCap(ctx, e.OrgID); err != nil {
			return err
		}
		planned := s.orgs.begin(e.OrgID, read, int64(cost), func() int64 {
			return s.slots.othersReserved(e.OrgID, st.Lease.HolderID, now)
		})
		e.Cost, *off = money.Amount(planned), cost-money.Amount(planned)
		e.Estimated = e.Estimated || *off > 0
		if st.Lease.HolderID != "" {
			// The request is over: its slot is free now, not after the commit, which it may
			// share with the settlements queued behind it.
			s.slots.release(e.OrgID, st.Lease.HolderID)
		}
		defer func() {
			committed := int64(0)
			if err == nil {
				committed = planned
			}
			s.orgs.end(e.OrgID, planned, committed)
		}()
	}
	delta := usage.DeltaOf(*e)
	err = s.writeChecked(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if s.slots == nil {
			// What the debit may take: the balance less the other leases' reservations.
			var limit int64
			err := s.stmt(ctx, tx, s.st.settleLimit).QueryRowContext(ctx, e.OrgID, st.Lease.HolderID, now).Scan(&limit)
			if errors.Is(err, sql.ErrNoRows) {
				return refuse(store.ErrNotFound)
			}
			if err != nil {
				return err
			}
			e.Cost, *off = store.Capped(cost, money.Amount(limit))
			e.Estimated = st.Event.Estimated || *off > 0
			delta = usage.DeltaOf(*e)
		}
		// The usage row comes first: where it is already there, or the organization is not,
		// the settlement is refused having changed nothing.
		res, err := s.stmt(ctx, tx, s.st.settleUsage).ExecContext(ctx,
			e.OrgID, e.GenerationID, e.Version, e.KeyID, e.Model, e.Endpoint, e.Stream, string(e.Status),
			e.HTTPStatus, e.FinishReason, e.PromptTokens, e.CachedTokens, e.CompletionTokens, int64(e.Cost),
			e.Estimated, started, e.TTFTMillis, e.DurationMillis, e.Backend)
		if err != nil {
			// Its foreign key: an unknown organization fails the insert, which changed nothing.
			if errors.Is(orgExists(ctx, tx, e.OrgID), store.ErrNotFound) {
				return refuse(store.ErrNotFound)
			}
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return refuse(errApplied)
		}
		if st.Lease.HolderID != "" && s.slots == nil {
			if _, err := s.stmt(ctx, tx, s.st.freeLease).ExecContext(ctx, e.OrgID, st.Lease.HolderID); err != nil {
				return err
			}
		}
		if e.Cost != 0 {
			if _, err := s.stmt(ctx, tx, s.st.settleLedger).ExecContext(ctx, e.OrgID, e.GenerationID, -int64(e.Cost), e.Model, now); err != nil {
				return err
			}
		}
		// The debit and the roll-up (the usage row, inserted just now with its folded column
		// set, is the marker that a later Fold of the same event finds):
		// written with the batch's others before it commits (sums.go), or here.
		if s.summing() {
			return s.sums.add(e.OrgID, e.Cost, delta)
		}
		if e.Cost != 0 {
			if _, err := s.stmt(ctx, tx, s.st.debit).ExecContext(ctx, int64(e.Cost), e.OrgID); err != nil {
				return err
			}
		}
		return s.addToDay(ctx, tx, delta)
	})
	return err
}

// balanceToCap reads the balance a gateway's Store (OwnSlots) caps a settlement's debit at, when
// it keeps no copy of the organization's row. A read that races with another settlement's commit
// may already hold that debit, which begin then subtracts again: the cap errs low, never high.
func (s *Store) balanceToCap(ctx context.Context, orgID string) (int64, error) {
	if s.orgs.kept(orgID) {
		return 0, nil // begin uses the copy
	}
	r, err := s.readAdmitRow(ctx, orgID)
	return r.balance, err
}

func scanEvent(row scanner) (usage.Event, error) {
	var (
		e             usage.Event
		status        string
		cost, started int64
	)
	err := row.Scan(&e.OrgID, &e.GenerationID, &e.Version, &e.KeyID, &e.Model, &e.Endpoint, &e.Stream, &status,
		&e.HTTPStatus, &e.FinishReason, &e.PromptTokens, &e.CachedTokens, &e.CompletionTokens, &cost,
		&e.Estimated, &started, &e.TTFTMillis, &e.DurationMillis, &e.Backend)
	if err != nil {
		return usage.Event{}, err
	}
	e.Status, e.Cost, e.StartedAt = usage.Status(status), money.Amount(cost), store.FromUnixNanos(started)
	return e, nil
}

// Generation returns the recorded event of one generation of this organization.
func (s *Store) Generation(ctx context.Context, orgID, generationID string) (usage.Event, error) {
	e, err := scanEvent(s.st.generation.QueryRowContext(ctx, orgID, generationID))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	return e, store.Wrapf(err, "generation %s of %s", generationID, orgID)
}

// Usage lists an organization's events started in [from, to), by start time then generation id.
func (s *Store) Usage(ctx context.Context, orgID string, from, to time.Time) ([]usage.Event, error) {
	f, t, err := store.UnixNanosRange(from, to)
	if err != nil {
		return nil, fmt.Errorf("usage of %s: %w", orgID, err)
	}
	events, err := listOrg(ctx, s, orgID, scanEvent, `SELECT `+usageColumns+` FROM usage WHERE org_id = ? AND started_at >= ? AND started_at < ?
		ORDER BY started_at, generation_id`, orgID, f, t)
	return events, store.Wrapf(err, "usage of %s", orgID)
}
