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
	return store.Wrapf(s.createKey(ctx, key), "create key %s", key.ID)
}

func (s *Store) createKey(ctx context.Context, key store.Key) error {
	created, err := store.CheckNewKey(key)
	if err != nil {
		return err
	}
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := orgExists(ctx, tx, key.OrgID); err != nil {
			return err
		}
		return exec(ctx, tx, store.ErrExists, `INSERT INTO keys (id, org_id, hash, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT DO NOTHING`, key.ID, key.OrgID, key.Hash[:], created)
	})
}

// Keys lists an organization's keys, oldest first.
func (s *Store) Keys(ctx context.Context, orgID string) ([]store.Key, error) {
	keys, err := listOrg(ctx, s, orgID, func(row scanner) (store.Key, error) {
		var (
			k                store.Key
			hash             []byte
			created, revoked *int64
		)
		err := row.Scan(&k.ID, &k.OrgID, &hash, &created, &revoked)
		copy(k.Hash[:], hash)
		k.CreatedAt = store.FromOptUnixNanos(created)
		if revoked != nil {
			t := store.FromUnixNanos(*revoked)
			k.RevokedAt = &t
		}
		return k, err
	}, `SELECT id, org_id, hash, created_at, revoked_at FROM keys WHERE org_id = ? ORDER BY created_at, id`, orgID)
	return keys, store.Wrapf(err, "keys of %s", orgID)
}

// RevokeKey revokes a key at the given time. Revoking a revoked key keeps the first time.
func (s *Store) RevokeKey(ctx context.Context, keyID string, at time.Time) error {
	n, err := store.UnixNanos("revoked_at", at)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", keyID, err)
	}
	err = s.update(ctx, store.ErrNotFound, `UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, n, keyID)
	return store.Wrapf(err, "revoke key %s", keyID)
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
