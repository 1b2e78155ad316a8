package sqlite

import (
	"context"
	"database/sql"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/usage"
)

// batchSums are what a batch's settlements take from organizations' balances and add to the day
// roll-ups. Each settlement writes its own usage row and ledger entry; the sums are written once
// per batch, one UPDATE per organization and one upsert per organization × day × model, just
// before the batch commits: under load that is a few statements for dozens of settlements
// instead of two for each. Only the writer goroutine touches them, and try clears them before
// every run of a batch, so that a batch run again cautiously adds up only what it applies.
//
// Only a store that owns its slots sums (see summing): there no write reads a balance, which
// would miss the debits of the batch's settlements before it, while admission in a store
// without reads it in the write transaction, where a settlement has already freed its slot.
// Should writing the sums fail (a total beyond an int64), the batch runs again cautiously with
// every settlement writing its own, so that only the one that overflows fails.
type batchSums struct {
	debits map[string]money.Amount
	days   map[dayKey]usage.Totals
}

type dayKey struct{ org, day, model string }

func newBatchSums() batchSums {
	return batchSums{debits: map[string]money.Amount{}, days: map[dayKey]usage.Totals{}}
}

func (b *batchSums) reset() {
	clear(b.debits)
	clear(b.days)
}

// add counts one settlement: its cost and its delta. A sum that would overflow is an error and
// changes nothing.
func (b *batchSums) add(orgID string, cost money.Amount, d usage.Delta) error {
	debit, err := b.debits[orgID].Add(cost)
	if err != nil {
		return err
	}
	k := dayKey{d.OrgID, d.Day, d.Model}
	day := b.days[k]
	if err := day.Add(d.Totals); err != nil {
		return err
	}
	b.debits[orgID], b.days[k] = debit, day
	return nil
}

// summing reports whether settlements add their debits and roll-ups to the batch's sums rather
// than write them.
func (s *Store) summing() bool { return s.slots != nil && !s.inlineSums }

// writeSums writes the batch's sums in tx.
func (s *Store) writeSums(ctx context.Context, tx *sql.Tx) error {
	for orgID, cost := range s.sums.debits {
		if cost == 0 {
			continue
		}
		if _, err := s.stmt(ctx, tx, s.st.debit).ExecContext(ctx, int64(cost), orgID); err != nil {
			return err
		}
	}
	for k, t := range s.sums.days {
		if err := s.addToDay(ctx, tx, usage.Delta{OrgID: k.org, Day: k.day, Model: k.model, Totals: t}); err != nil {
			return err
		}
	}
	return nil
}
