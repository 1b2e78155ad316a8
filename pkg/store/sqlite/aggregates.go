package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Fold writes d's marker and adds d to its day × model and month roll-ups in one transaction;
// a marker already there changes nothing. A cost sum beyond an int64 of picodollars fails (SQLite
// would turn it into a REAL, which the STRICT table refuses).
func (s *Store) Fold(ctx context.Context, d usage.Delta) (bool, error) {
	if err := store.CheckDelta(d); err != nil {
		return false, err
	}
	err := s.writeChecked(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := s.stmt(ctx, tx, s.st.foldMark).ExecContext(ctx, d.OrgID, d.GenerationID, d.Day)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return refuse(errApplied) // the marker is there already: nothing changed
		}
		return s.addToDay(ctx, tx, d)
	})
	if errors.Is(err, errApplied) {
		return false, nil
	}
	return err == nil, store.Wrapf(err, "fold %s of %s", d.GenerationID, d.OrgID)
}

// addToDay adds an event's totals to its organization × day × model roll-up.
func (s *Store) addToDay(ctx context.Context, tx *sql.Tx, d usage.Delta) error {
	t := d.Totals
	_, err := s.stmt(ctx, tx, s.st.foldDay).ExecContext(ctx,
		d.OrgID, d.Day, d.Model, t.Requests, t.PromptTokens, t.CachedTokens, t.CompletionTokens, int64(t.Cost))
	return err
}

// DailyRollups lists an organization's day × model roll-ups for the days from..to, by day then
// model.
func (s *Store) DailyRollups(ctx context.Context, orgID, fromDay, toDay string) ([]usage.Rollup, error) {
	rollups, err := s.rollups(ctx, orgID, `SELECT day, '', model, requests, prompt_tokens, cached_tokens,
		completion_tokens, cost FROM rollup_days WHERE org_id = ? AND day BETWEEN ? AND ? ORDER BY day, model`,
		fromDay, toDay)
	return rollups, store.Wrapf(err, "daily roll-ups of %s", orgID)
}

// MonthlyRollups lists an organization's month roll-ups for the months from..to, by month: the
// sums of their days' roll-ups.
func (s *Store) MonthlyRollups(ctx context.Context, orgID, fromMonth, toMonth string) ([]usage.Rollup, error) {
	rollups, err := s.rollups(ctx, orgID, `SELECT '', substr(day, 1, 7) AS month, '', sum(requests),
		sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(cost) FROM rollup_days
		WHERE org_id = ?1 AND day BETWEEN ?2 || '-01' AND ?3 || '-31' GROUP BY month ORDER BY month`,
		fromMonth, toMonth)
	return rollups, store.Wrapf(err, "monthly roll-ups of %s", orgID)
}

func (s *Store) rollups(ctx context.Context, orgID, query, from, to string) ([]usage.Rollup, error) {
	return listOrg(ctx, s, orgID, func(row scanner) (usage.Rollup, error) {
		r := usage.Rollup{OrgID: orgID}
		var cost int64
		err := row.Scan(&r.Day, &r.Month, &r.Model, &r.Requests, &r.PromptTokens, &r.CachedTokens,
			&r.CompletionTokens, &cost)
		r.Cost = money.Amount(cost)
		return r, err
	}, query, orgID, from, to)
}

var _ store.Store = (*Store)(nil)
