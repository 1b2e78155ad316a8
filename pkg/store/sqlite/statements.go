package sqlite

import (
	"context"
	"database/sql"
	"errors"
)

// statements are the hot path's prepared statements. The write ones are prepared on the single
// write connection and reused inside each transaction through Store.stmt.
type statements struct {
	authenticate *sql.Stmt
	org          *sql.Stmt
	generation   *sql.Stmt
	maintenance  *sql.Stmt
	admitOrg     *sql.Stmt

	savepoint  *sql.Stmt
	rollbackTo *sql.Stmt
	release    *sql.Stmt

	admitCheck  *sql.Stmt
	admitPurge  *sql.Stmt
	admitInsert *sql.Stmt

	freeLease    *sql.Stmt // a settlement's lease, and the mirror's copy of a freed slot
	settleLimit  *sql.Stmt
	settleUsage  *sql.Stmt
	settleLedger *sql.Stmt
	debit        *sql.Stmt

	foldMark *sql.Stmt
	foldDay  *sql.Stmt

	mirrorClear *sql.Stmt
	mirrorPut   *sql.Stmt

	all []*sql.Stmt // every statement prepared, for close
}

// orgColumns are what scanOrg reads: the reserved credits are those of the leases in the table.
const orgColumns = `id, name, status, max_in_flight, balance, created_at,
	(SELECT coalesce(sum(reserved), 0) FROM leases WHERE leases.org_id = orgs.id)`

const usageColumns = `org_id, generation_id, version, key_id, model, endpoint, stream, status,
	http_status, finish_reason, prompt_tokens, cached_tokens, completion_tokens, cost, estimated,
	started_at, ttft_ms, duration_ms, backend`

func (st *statements) prepare(ctx context.Context, w, r *sql.DB) error {
	for _, p := range []struct {
		db    *sql.DB
		stmt  **sql.Stmt
		query string
	}{
		{r, &st.authenticate, `SELECT k.id, k.revoked_at, o.id, o.status, o.max_in_flight
			FROM keys k JOIN orgs o ON o.id = k.org_id WHERE k.hash = ?`},
		{r, &st.org, `SELECT ` + orgColumns + ` FROM orgs WHERE id = ?`},
		{r, &st.generation, `SELECT ` + usageColumns + ` FROM usage WHERE org_id = ? AND generation_id = ?`},
		{r, &st.maintenance, `SELECT on_, until FROM maintenance WHERE id = 1`},
		{r, &st.admitOrg, `SELECT status, balance, max_in_flight FROM orgs WHERE id = ?`},

		{w, &st.savepoint, `SAVEPOINT write`},
		{w, &st.rollbackTo, `ROLLBACK TO write`},
		{w, &st.release, `RELEASE write`},

		// One pass over the organization's leases counts those that hold a slot at ?2 and
		// those that have expired; no row when the organization does not exist.
		{w, &st.admitCheck, `SELECT o.status, o.balance, o.max_in_flight,
			count(l.holder_id) FILTER (WHERE l.expires_at > ?2),
			count(l.holder_id) FILTER (WHERE l.expires_at <= ?2),
			coalesce(sum(l.reserved) FILTER (WHERE l.expires_at > ?2), 0)
			FROM orgs o LEFT JOIN leases l ON l.org_id = o.id WHERE o.id = ?1 GROUP BY o.id`},
		{w, &st.admitPurge, `DELETE FROM leases WHERE org_id = ? AND expires_at <= ?`},
		{w, &st.admitInsert, `INSERT INTO leases (org_id, holder_id, expires_at, reserved) VALUES (?, ?, ?, ?)
			ON CONFLICT DO NOTHING`},

		{w, &st.freeLease, `DELETE FROM leases WHERE org_id = ? AND holder_id = ?`},
		// What a settlement may debit: the balance less the reservations of the organization's
		// other unexpired leases (its own reservation, if it is still held, is covered).
		{w, &st.settleLimit, `SELECT o.balance - coalesce((SELECT sum(reserved) FROM leases l
			WHERE l.org_id = o.id AND l.holder_id != ?2 AND l.expires_at > ?3), 0)
			FROM orgs o WHERE o.id = ?1`},
		{w, &st.settleUsage, `INSERT INTO usage (` + usageColumns + `, folded)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT DO NOTHING`},
		{w, &st.settleLedger, `INSERT INTO ledger (org_id, id, kind, amount, note, at)
			VALUES (?, ?, 'debit', ?, ?, ?)`},
		{w, &st.debit, `UPDATE orgs SET balance = balance - ? WHERE id = ?`},

		// No marker, and nothing to fold, for an event its settlement folded.
		{w, &st.foldMark, `INSERT INTO rollup_marks (org_id, generation_id, day) SELECT ?1, ?2, ?3
			WHERE NOT EXISTS (SELECT 1 FROM usage WHERE org_id = ?1 AND generation_id = ?2 AND folded)
			ON CONFLICT DO NOTHING`},
		{w, &st.foldDay, `INSERT INTO rollup_days (org_id, day, model, requests,
			prompt_tokens, cached_tokens, completion_tokens, cost) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (org_id, day, model) DO UPDATE SET requests = requests + excluded.requests,
			prompt_tokens = prompt_tokens + excluded.prompt_tokens,
			cached_tokens = cached_tokens + excluded.cached_tokens,
			completion_tokens = completion_tokens + excluded.completion_tokens,
			cost = cost + excluded.cost`},

		{w, &st.mirrorClear, `DELETE FROM leases`},
		// Only for an organization that exists: one deleted meanwhile (the foreign key) is no
		// reason to lose the copy of the others.
		{w, &st.mirrorPut, `INSERT INTO leases (org_id, holder_id, expires_at, reserved)
			SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM orgs WHERE id = ?1)
			ON CONFLICT (org_id, holder_id) DO UPDATE SET expires_at = excluded.expires_at, reserved = excluded.reserved`},
	} {
		s, err := p.db.PrepareContext(ctx, p.query)
		if err != nil {
			return err
		}
		*p.stmt = s
		st.all = append(st.all, s)
	}
	return nil
}

func (st *statements) close() error {
	var errs []error
	for _, s := range st.all {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
