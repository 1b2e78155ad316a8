package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/store"
)

// Maintenance returns the maintenance window; off when none was ever set.
func (s *Store) Maintenance(ctx context.Context) (store.Maintenance, error) {
	var (
		m     store.Maintenance
		until *int64
	)
	err := s.st.maintenance.QueryRowContext(ctx).Scan(&m.On, &until)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Maintenance{}, nil
	}
	if err != nil {
		return store.Maintenance{}, fmt.Errorf("maintenance: %w", err)
	}
	m.Until = store.FromOptUnixNanos(until)
	return m, nil
}

// SetMaintenance replaces the maintenance window.
func (s *Store) SetMaintenance(ctx context.Context, m store.Maintenance) error {
	until, err := store.OptUnixNanos("until", m.Until)
	if err != nil {
		return fmt.Errorf("set maintenance: %w", err)
	}
	err = s.update(ctx, nil, `INSERT INTO maintenance (id, on_, until) VALUES (1, ?, ?)
		ON CONFLICT (id) DO UPDATE SET on_ = excluded.on_, until = excluded.until`, m.On, until)
	return store.Wrapf(err, "set maintenance")
}
