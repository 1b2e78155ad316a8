package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// CreateOrg creates an organization with a zero balance: credits arrive only through the ledger.
// A zero MaxInFlight means store.DefaultMaxInFlight and an empty Status means active.
func (s *Store) CreateOrg(ctx context.Context, org store.Org) error {
	defer s.orgChanged(org.ID)
	return store.Wrapf(s.createOrg(ctx, org), "create org %s", org.ID)
}

func (s *Store) createOrg(ctx context.Context, org store.Org) error {
	org, created, err := store.NewOrg(org)
	if err != nil {
		return err
	}
	return s.update(ctx, store.ErrExists, `INSERT INTO orgs (id, name, status, max_in_flight, balance, created_at)
		VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT DO NOTHING`, org.ID, org.Name, string(org.Status), org.MaxInFlight, created)
}

type scanner interface{ Scan(dest ...any) error }

// scanOrg reads an organization's row (orgColumns); a gateway's Store then tells the reservations
// of its own slots, of which the table holds a copy up to mirrorEvery behind.
func (s *Store) scanOrg(row scanner) (store.Org, error) {
	var (
		o        store.Org
		status   string
		balance  int64
		reserved int64
		created  *int64
	)
	if err := row.Scan(&o.ID, &o.Name, &status, &o.MaxInFlight, &balance, &created, &reserved); err != nil {
		return store.Org{}, err
	}
	o.Status, o.Balance, o.CreatedAt = store.OrgStatus(status), money.Amount(balance), store.FromOptUnixNanos(created)
	o.Reserved = money.Amount(reserved)
	if s.slots != nil {
		o.Reserved = s.slots.reserved(o.ID)
	}
	return o, nil
}

// Org returns one organization with its current balance.
func (s *Store) Org(ctx context.Context, orgID string) (store.Org, error) {
	o, err := s.scanOrg(s.st.org.QueryRowContext(ctx, orgID))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	return o, store.Wrapf(err, "org %s", orgID)
}

// Orgs lists every organization, by ID.
func (s *Store) Orgs(ctx context.Context) ([]store.Org, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+orgColumns+` FROM orgs ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("orgs: %w", err)
	}
	orgs, err := scanAll(rows, s.scanOrg)
	return orgs, store.Wrapf(err, "orgs")
}

// SetOrgStatus suspends or resumes an organization.
func (s *Store) SetOrgStatus(ctx context.Context, orgID string, status store.OrgStatus) error {
	defer s.orgChanged(orgID)
	if err := store.CheckOrg(status, 1); err != nil {
		return fmt.Errorf("set status of %s: %w", orgID, err)
	}
	err := s.update(ctx, store.ErrNotFound, `UPDATE orgs SET status = ? WHERE id = ?`, string(status), orgID)
	return store.Wrapf(err, "set status of %s", orgID)
}

// SetMaxInFlight sets an organization's in-flight limit; holders above a lowered limit keep
// their slots until they release them.
func (s *Store) SetMaxInFlight(ctx context.Context, orgID string, n int) error {
	defer s.orgChanged(orgID)
	if err := store.CheckOrg(store.OrgActive, n); err != nil {
		return fmt.Errorf("set limit of %s: %w", orgID, err)
	}
	err := s.update(ctx, store.ErrNotFound, `UPDATE orgs SET max_in_flight = ? WHERE id = ?`, n, orgID)
	return store.Wrapf(err, "set limit of %s", orgID)
}

// orgChanged drops a gateway's Store's copy of an organization's row (memslots.go) after this
// Store changed it.
func (s *Store) orgChanged(orgID string) {
	if s.orgs != nil {
		s.orgs.forget(orgID)
	}
}

// update runs one statement in a write of its own; none when it changes no row, which the
// statement's own condition decided.
func (s *Store) update(ctx context.Context, none error, query string, args ...any) error {
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return exec(ctx, tx, none, query, args...)
	})
}

// exec runs one statement in tx; none when it changes no row.
func exec(ctx context.Context, tx *sql.Tx, none error, query string, args ...any) error {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return none
	}
	return nil
}

// orgExists reports store.ErrNotFound when the organization does not exist.
func orgExists(ctx context.Context, tx *sql.Tx, orgID string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM orgs WHERE id = ?`, orgID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// listOrg runs a query for one organization's rows in a read transaction, so that an unknown
// organization is told apart from one with no rows, and scans each row.
func listOrg[T any](ctx context.Context, s *Store, orgID string, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if err := orgExists(ctx, tx, orgID); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanAll(rows, scan)
}

// scanAll scans every row of rows, then closes them.
func scanAll[T any](rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
