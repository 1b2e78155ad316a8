package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// AddEntry applies a top-up (a positive amount) or an adjustment (any non-zero amount). Debits
// come only from Settle. An entry whose ID the organization already has changes nothing and
// returns ErrExists.
func (s *Store) AddEntry(ctx context.Context, e store.LedgerEntry) error {
	defer s.orgChanged(e.OrgID)
	if err := checkEntry(e); err != nil {
		return fmt.Errorf("add entry %s to %s: %w", e.ID, e.OrgID, err)
	}
	at, err := store.UnixNanos("at", e.At)
	if err != nil {
		return fmt.Errorf("add entry %s to %s: %w", e.ID, e.OrgID, err)
	}
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE orgs SET balance = balance + ? WHERE id = ?`, int64(e.Amount), e.OrgID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.ErrNotFound
		}
		res, err = tx.ExecContext(ctx, `INSERT INTO ledger (org_id, id, kind, amount, note, at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
			e.OrgID, e.ID, string(e.Kind), int64(e.Amount), e.Note, at)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.ErrExists // rolls back the balance update
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add entry %s to %s: %w", e.ID, e.OrgID, err)
	}
	return nil
}

func checkEntry(e store.LedgerEntry) error {
	if e.ID == "" {
		return errors.New("empty id")
	}
	switch e.Kind {
	case store.EntryTopUp:
		if e.Amount <= 0 {
			return fmt.Errorf("a top-up of %s: must be positive", e.Amount)
		}
	case store.EntryAdjustment:
		if e.Amount == 0 {
			return errors.New("an adjustment of zero")
		}
	default:
		return fmt.Errorf("kind %q: only top-ups and adjustments are added directly", e.Kind)
	}
	return nil
}

// Ledger lists an organization's ledger entries by time, then ID.
func (s *Store) Ledger(ctx context.Context, orgID string) ([]store.LedgerEntry, error) {
	var entries []store.LedgerEntry
	err := s.list(ctx, orgID, func(rows *sql.Rows) error {
		var (
			e          store.LedgerEntry
			kind       string
			amount, at int64
		)
		if err := rows.Scan(&e.ID, &e.OrgID, &kind, &amount, &e.Note, &at); err != nil {
			return err
		}
		e.Kind, e.Amount, e.At = store.EntryKind(kind), money.Amount(amount), store.FromUnixNanos(at)
		entries = append(entries, e)
		return nil
	}, `SELECT id, org_id, kind, amount, note, at FROM ledger WHERE org_id = ? ORDER BY at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("ledger of %s: %w", orgID, err)
	}
	return entries, nil
}
