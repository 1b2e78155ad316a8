package sqlite

import (
	"context"
	"database/sql"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// AddEntry applies a top-up (a positive amount) or an adjustment (any non-zero amount). Debits
// come only from Settle. An entry whose ID the organization already has changes nothing and
// returns ErrExists.
func (s *Store) AddEntry(ctx context.Context, e store.LedgerEntry) error {
	defer s.orgChanged(e.OrgID)
	return store.Wrapf(s.addEntry(ctx, e), "add entry %s to %s", e.ID, e.OrgID)
}

func (s *Store) addEntry(ctx context.Context, e store.LedgerEntry) error {
	at, err := store.CheckEntry(e)
	if err != nil {
		return err
	}
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := exec(ctx, tx, store.ErrNotFound, `UPDATE orgs SET balance = balance + ? WHERE id = ?`, int64(e.Amount), e.OrgID); err != nil {
			return err
		}
		// ErrExists rolls back the balance update.
		return exec(ctx, tx, store.ErrExists, `INSERT INTO ledger (org_id, id, kind, amount, note, at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, e.OrgID, e.ID, string(e.Kind), int64(e.Amount), e.Note, at)
	})
}

// Ledger lists an organization's ledger entries by time, then ID.
func (s *Store) Ledger(ctx context.Context, orgID string) ([]store.LedgerEntry, error) {
	entries, err := listOrg(ctx, s, orgID, func(row scanner) (store.LedgerEntry, error) {
		var (
			e          store.LedgerEntry
			kind       string
			amount, at int64
		)
		err := row.Scan(&e.ID, &e.OrgID, &kind, &amount, &e.Note, &at)
		e.Kind, e.Amount, e.At = store.EntryKind(kind), money.Amount(amount), store.FromUnixNanos(at)
		return e, err
	}, `SELECT id, org_id, kind, amount, note, at FROM ledger WHERE org_id = ? ORDER BY at, id`, orgID)
	return entries, store.Wrapf(err, "ledger of %s", orgID)
}
