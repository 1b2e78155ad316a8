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
	if org.ID == "" {
		return errors.New("create org: empty id")
	}
	if org.Balance != 0 {
		return fmt.Errorf("create org %s: a new organization's balance is zero; add credits with a ledger entry", org.ID)
	}
	if org.MaxInFlight == 0 {
		org.MaxInFlight = store.DefaultMaxInFlight
	}
	if org.Status == "" {
		org.Status = store.OrgActive
	}
	if err := store.CheckOrg(org.Status, org.MaxInFlight); err != nil {
		return fmt.Errorf("create org %s: %w", org.ID, err)
	}
	created, err := optNanos("created_at", org.CreatedAt)
	if err != nil {
		return fmt.Errorf("create org %s: %w", org.ID, err)
	}
	var res sql.Result
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err = tx.ExecContext(ctx, `INSERT INTO orgs (id, name, status, max_in_flight, balance, created_at)
			VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT DO NOTHING`,
			org.ID, org.Name, string(org.Status), org.MaxInFlight, created)
		return err
	})
	if err != nil {
		return fmt.Errorf("create org %s: %w", org.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("create org %s: %w", org.ID, store.ErrExists)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scanOrg(row scanner) (store.Org, error) {
	var (
		o        store.Org
		status   string
		balance  int64
		reserved int64
		created  sql.NullInt64
	)
	if err := row.Scan(&o.ID, &o.Name, &status, &o.MaxInFlight, &balance, &created, &reserved); err != nil {
		return store.Org{}, err
	}
	o.Status, o.Balance, o.CreatedAt = store.OrgStatus(status), money.Amount(balance), fromOptNanos(created)
	o.Reserved = money.Amount(reserved)
	return o, nil
}

// Org returns one organization with its current balance.
func (s *Store) Org(ctx context.Context, orgID string) (store.Org, error) {
	o, err := scanOrg(s.st.org.QueryRowContext(ctx, orgID))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Org{}, fmt.Errorf("org %s: %w", orgID, err)
	}
	if s.slots != nil {
		o.Reserved = s.slots.reserved(orgID) // the table holds a copy up to mirrorEvery behind
	}
	return o, nil
}

// Orgs lists every organization, by ID.
func (s *Store) Orgs(ctx context.Context) ([]store.Org, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+orgColumns+` FROM orgs ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("orgs: %w", err)
	}
	defer rows.Close()
	var orgs []store.Org
	for rows.Next() {
		o, err := scanOrg(rows)
		if err != nil {
			return nil, fmt.Errorf("orgs: %w", err)
		}
		if s.slots != nil {
			o.Reserved = s.slots.reserved(o.ID)
		}
		orgs = append(orgs, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orgs: %w", err)
	}
	return orgs, nil
}

// SetOrgStatus suspends or resumes an organization.
func (s *Store) SetOrgStatus(ctx context.Context, orgID string, status store.OrgStatus) error {
	defer s.orgChanged(orgID)
	if err := store.CheckOrg(status, 1); err != nil {
		return fmt.Errorf("set status of %s: %w", orgID, err)
	}
	return s.update(ctx, "set status of "+orgID, `UPDATE orgs SET status = ? WHERE id = ?`, string(status), orgID)
}

// SetMaxInFlight sets an organization's in-flight limit; holders above a lowered limit keep
// their slots until they release them.
func (s *Store) SetMaxInFlight(ctx context.Context, orgID string, n int) error {
	defer s.orgChanged(orgID)
	if err := store.CheckOrg(store.OrgActive, n); err != nil {
		return fmt.Errorf("set limit of %s: %w", orgID, err)
	}
	return s.update(ctx, "set limit of "+orgID, `UPDATE orgs SET max_in_flight = ? WHERE id = ?`, n, orgID)
}

// orgChanged drops a gateway's Store's copy of an organization's row (memslots.go) after this
// Store changed it.
func (s *Store) orgChanged(orgID string) {
	if s.orgs != nil {
		s.orgs.forget(orgID)
	}
}

func (s *Store) update(ctx context.Context, op, query string, args ...any) error {
	var res sql.Result
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
		res, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%s: %w", op, store.ErrNotFound)
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

// list runs a query for one organization's rows in a read transaction, so that an unknown
// organization is told apart from one with no rows.
func (s *Store) list(ctx context.Context, orgID string, scan func(*sql.Rows) error, query string, args ...any) error {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := orgExists(ctx, tx, orgID); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
