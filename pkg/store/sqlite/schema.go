package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations[i] brings the schema from version i to version i+1; PRAGMA user_version holds the
// version a database is at.
var migrations = []string{
	`
CREATE TABLE orgs (
	id            TEXT PRIMARY KEY,
	name          TEXT NOT NULL,
	status        TEXT NOT NULL CHECK (status IN ('active', 'suspended')),
	max_in_flight INTEGER NOT NULL CHECK (max_in_flight > 0),
	balance       INTEGER NOT NULL DEFAULT 0, -- picodollars
	created_at    INTEGER                     -- Unix nanoseconds, like every time below
) STRICT;

CREATE TABLE keys (
	id         TEXT PRIMARY KEY,
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	hash       BLOB NOT NULL UNIQUE CHECK (length(hash) = 32), -- SHA-256 of the key
	created_at INTEGER,
	revoked_at INTEGER
) STRICT;
CREATE INDEX keys_org ON keys (org_id, created_at, id);

CREATE TABLE ledger (
	org_id TEXT NOT NULL REFERENCES orgs (id),
	id     TEXT NOT NULL, -- a debit's id is its generation id
	kind   TEXT NOT NULL CHECK (kind IN ('top_up', 'debit', 'adjustment')),
	amount INTEGER NOT NULL,
	note   TEXT NOT NULL,
	at     INTEGER NOT NULL,
	PRIMARY KEY (org_id, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX ledger_org_at ON ledger (org_id, at, id);

CREATE TABLE leases (
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	holder_id  TEXT NOT NULL,
	expires_at INTEGER NOT NULL,
	PRIMARY KEY (org_id, holder_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE usage (
	org_id            TEXT NOT NULL REFERENCES orgs (id),
	generation_id     TEXT NOT NULL,
	version           INTEGER NOT NULL,
	key_id            TEXT NOT NULL,
	model             TEXT NOT NULL,
	endpoint          TEXT NOT NULL,
	stream            INTEGER NOT NULL,
	status            TEXT NOT NULL,
	http_status       INTEGER NOT NULL,
	finish_reason     TEXT NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	cached_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	cost              INTEGER NOT NULL, -- picodollars
	estimated         INTEGER NOT NULL,
	started_at        INTEGER NOT NULL,
	ttft_ms           INTEGER NOT NULL,
	duration_ms       INTEGER NOT NULL,
	backend           TEXT NOT NULL,
	PRIMARY KEY (org_id, generation_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX usage_org_started ON usage (org_id, started_at, generation_id);

CREATE TABLE maintenance (
	id    INTEGER PRIMARY KEY CHECK (id = 1),
	on_   INTEGER NOT NULL,
	until INTEGER
) STRICT;
`,
}

// migrate brings the schema up to date in one write transaction, so that two processes opening a
// new directory at once do not both create it.
func migrate(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("migrate: schema version %d is newer than this program's %d", v, len(migrations))
	}
	if v == len(migrations) {
		return nil
	}
	for ; v < len(migrations); v++ {
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			return fmt.Errorf("migrate to version %d: %w", v+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}
