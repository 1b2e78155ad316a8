package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// CreateKey stores a key's ID and hash. ErrExists when either is taken, ErrNotFound when the
// organization does not exist.
func (s *Store) CreateKey(ctx context.Context, key store.Key) error {
	if key.ID == "" {
		return errors.New("create key: empty id")
	}
	if key.RevokedAt != nil {
		return fmt.Errorf("create key %s: a new key cannot be revoked", key.ID)
	}
	created, err := optNanos("created_at", key.CreatedAt)
	if err != nil {
		return fmt.Errorf("create key %s: %w", key.ID, err)
	}
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := orgExists(ctx, tx, key.OrgID); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO keys (id, org_id, hash, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT DO NOTHING`, key.ID, key.OrgID, key.Hash[:], created)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.ErrExists
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create key %s: %w", key.ID, err)
	}
	return nil
}

// Keys lists an organization's keys, oldest first.
func (s *Store) Keys(ctx context.Context, orgID string) ([]store.Key, error) {
	var keys []store.Key
	err := s.list(ctx, orgID, func(rows *sql.Rows) error {
		var (
			k                store.Key
			hash             []byte
			created, revoked sql.NullInt64
		)
		if err := rows.Scan(&k.ID, &k.OrgID, &hash, &created, &revoked); err != nil {
			return err
		}
		copy(k.Hash[:], hash)
		k.CreatedAt = fromOptNanos(created)
		if revoked.Valid {
			t := store.FromUnixNanos(revoked.Int64)
			k.RevokedAt = &t
		}
		keys = append(keys, k)
		return nil
	}, `SELECT id, org_id, hash, created_at, revoked_at FROM keys WHERE org_id = ? ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("keys of %s: %w", orgID, err)
	}
	return keys, nil
}

// RevokeKey revokes a key at the given time. Revoking a revoked key keeps the first time.
func (s *Store) RevokeKey(ctx context.Context, keyID string, at time.Time) error {
	n, err := store.UnixNanos("revoked_at", at)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	return s.update(ctx, "revoke key "+keyID,
		`UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, n, keyID)
}

// Authenticate finds the key with this SHA-256 hash and its organization.
func (s *Store) Authenticate(ctx context.Context, keyHash [32]byte) (store.Principal, error) {
	var (
		p       store.Principal
		revoked sql.NullInt64
		status  string
	)
	err := s.st.authenticate.QueryRowContext(ctx, keyHash[:]).Scan(&p.KeyID, &revoked, &p.OrgID, &status, &p.MaxInFlight)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// The hash is a secret's digest: it is never put into an error.
		return store.Principal{}, fmt.Errorf("authenticate: %w", store.ErrNotFound)
	case err != nil:
		return store.Principal{}, fmt.Errorf("authenticate: %w", err)
	case revoked.Valid:
		return store.Principal{}, fmt.Errorf("authenticate %s: %w", p.KeyID, store.ErrKeyRevoked)
	}
	p.OrgStatus = store.OrgStatus(status)
	return p, nil
}
