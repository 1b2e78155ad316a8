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
	// 2: the usage records become the outbox of the usage pipeline, and the aggregates.
	`
-- When the bus has not yet acknowledged a usage event: its settlement time (Unix ns); NULL once
-- published. Events recorded before this version had no bus and no aggregates: they start out
-- unpublished, so that the first sweep folds them in.
ALTER TABLE usage ADD COLUMN unpublished_since INTEGER;
UPDATE usage SET unpublished_since = started_at;
CREATE INDEX usage_unpublished ON usage (unpublished_since, org_id, generation_id)
	WHERE unpublished_since IS NOT NULL;

-- The aggregates (usage.Aggregator): one marker per folded generation id, written in the same
-- transaction as the additions, so that a replay changes nothing.
CREATE TABLE rollup_marks (
	org_id        TEXT NOT NULL,
	generation_id TEXT NOT NULL,
	day           TEXT NOT NULL,
	PRIMARY KEY (org_id, generation_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE rollup_days (
	org_id            TEXT NOT NULL,
	day               TEXT NOT NULL, -- UTC YYYY-MM-DD
	model             TEXT NOT NULL,
	requests          INTEGER NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	cached_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	cost              INTEGER NOT NULL, -- picodollars
	PRIMARY KEY (org_id, day, model)
) STRICT, WITHOUT ROWID;

CREATE TABLE rollup_months (
	org_id            TEXT NOT NULL,
	month             TEXT NOT NULL, -- UTC YYYY-MM
	requests          INTEGER NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	cached_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	cost              INTEGER NOT NULL,
	PRIMARY KEY (org_id, month)
) STRICT, WITHOUT ROWID;
`,
	// 3: a month's roll-up is the sum of its days', read when asked for (MonthlyRollups), not a
	// table that every settlement updated too. Both were written in the same transactions, so
	// the days hold everything the months did.
	`
DROP TABLE rollup_months;
`,
	// 4: an event that its own settlement folded into the aggregates (a store without a bus) is
	// marked so on its usage row, which is its marker: Fold finds it there, and the settlement
	// writes no rollup_marks row. Events folded before this version have their markers.
	`
ALTER TABLE usage ADD COLUMN folded INTEGER NOT NULL DEFAULT 0;
`,
	// 5: a lease holds a reservation of credits (picodollars), the most its request can cost;
	// the balance less the reservations is what a new request may reserve.
	`
ALTER TABLE leases ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0);
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
