package finance

import (
	"context"
	"fmt"
	"time"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/usage"
)

// Records streams the usage records of the UTC days from..to (both included; "" leaves that
// end open), of one organization when orgID is set, in the order the export holds them.
// Records of requests still running are skipped and counted.
func (x *Export) Records(ctx context.Context, from, to, orgID string, fn func(Record) error) (inProgress int64, err error) {
	if !x.Has(Usage) {
		return 0, fmt.Errorf("export %s: no export of the usage table there (tables found: %v)", x, x.Tables())
	}
	err = x.Items(ctx, []Table{Usage}, func(t Table, it Item) error {
		if t != Usage {
			return nil
		}
		r, err := DecodeRecord(it)
		if err != nil {
			return err
		}
		switch {
		case r.InProgress():
			inProgress++
			return nil
		case orgID != "" && r.OrgID != orgID, from != "" && r.Day < from, to != "" && r.Day > to:
			return nil
		}
		return fn(r)
	})
	return inProgress, err
}

// Reconcile reconciles the days opt.From..opt.To of an export that holds the ledger and usage
// tables, and the aggregates table when it holds that too (then with its markers).
func (x *Export) Reconcile(ctx context.Context, opt Options) (Result, error) {
	if !x.Has(Ledger) || !x.Has(Usage) {
		return Result{}, fmt.Errorf("export %s: reconciling needs exports of the ledger and usage tables; found %v", x, x.Tables())
	}
	opt.Aggregates, opt.Markers = x.Has(Aggregates), x.Has(Aggregates)
	r, err := NewReconciler(opt)
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	err = x.Items(ctx, []Table{Ledger, Usage, Aggregates}, func(t Table, it Item) error { return r.Item(t, it) })
	if err != nil {
		return Result{}, err
	}
	return r.Finish()
}

// TableReader is what the scheduled reconciliation reads of the tables themselves
// (dynamo.Store implements it): the organizations, and per organization its usage items that
// started in a time range (the by-started index), its ledger items with entry IDs in a range
// (debits are keyed by generation id, whose ULID begins with its time), and its day roll-ups.
type TableReader interface {
	OrgIDs(ctx context.Context) ([]string, error)
	UsageItems(ctx context.Context, orgID string, from, to time.Time, fn func(Item) error) error
	LedgerItems(ctx context.Context, orgID, fromID, toID string, fn func(Item) error) error
	DayRollupItems(ctx context.Context, orgID, fromDay, toDay string, fn func(Item) error) error
	MarkerItems(ctx context.Context, orgID string, generationIDs []string, fn func(Item) error) error
}

// idMargin widens the time range of the generations read: a generation id's time is taken when
// the request starts, within milliseconds of its started_at, and a request may run long before
// its debit is written.
const idMargin = time.Hour

// ReconcileTables reconciles the days opt.From..opt.To from the tables: ledger against usage per
// generation, and the day roll-ups against the usage records per organization × day. The
// generation markers are read only for an organization × day whose roll-ups differ (a read per
// request otherwise), to name the generations behind the difference.
func ReconcileTables(ctx context.Context, tr TableReader, opt Options) (Result, error) {
	orgs, err := tr.OrgIDs(ctx)
	if err != nil {
		return Result{}, err
	}
	res, err := reconcileTables(ctx, tr, orgs, opt, false)
	if err != nil {
		return Result{}, err
	}
	diffs := []Difference{} // [] in JSON, not null, when none differ
	count := res.DifferenceCount
	for _, d := range res.Differences {
		if d.Kind != RollupDiffers {
			diffs = append(diffs, d)
			continue
		}
		// Again for that organization and day, with the markers of its generations.
		one := opt
		one.From, one.To = d.Day, d.Day
		detail, err := reconcileTables(ctx, tr, []string{d.OrgID}, one, true)
		if err != nil {
			return Result{}, err
		}
		// The ledger's differences of that day are listed already. (A day with more
		// differences than opt.MaxListed is counted by those listed: still not zero.)
		var found []Difference
		for _, dd := range detail.Differences {
			switch dd.Kind {
			case NotAggregated, AggregatedWithoutUsage, AggregateDiffers, RollupDiffers, Duplicate:
				found = append(found, dd)
			}
		}
		if len(found) == 0 {
			found = []Difference{d}
		}
		diffs = append(diffs, found...)
		count += len(found) - 1
	}
	res.Differences, res.DifferenceCount = diffs, count
	return res, nil
}

func reconcileTables(ctx context.Context, tr TableReader, orgs []string, opt Options, markers bool) (Result, error) {
	opt.Aggregates, opt.Markers = true, markers
	r, err := NewReconciler(opt)
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	from, _ := time.Parse(time.DateOnly, opt.From)
	to, _ := time.Parse(time.DateOnly, opt.To)
	end := to.AddDate(0, 0, 1)
	for _, org := range orgs {
		// Usage from an hour before the first day, to match debits of requests that ran over
		// midnight; the Reconciler keeps only the days asked for.
		var gens []string
		flush := func() error {
			if len(gens) == 0 {
				return nil
			}
			err := tr.MarkerItems(ctx, org, gens, func(it Item) error { return r.Item(Aggregates, it) })
			gens = gens[:0]
			return err
		}
		err := tr.UsageItems(ctx, org, from.Add(-idMargin), end, func(it Item) error {
			if err := r.Item(Usage, it); err != nil {
				return err
			}
			if markers {
				if g := ddbitem.NewReader(it).OptStr("generation_id"); g != "" {
					if gens = append(gens, g); len(gens) == 100 {
						return flush()
					}
				}
			}
			return nil
		})
		if err == nil {
			err = flush()
		}
		if err != nil {
			return Result{}, err
		}
		lo, hi := usage.GenerationIDRange(from.Add(-idMargin), end.Add(idMargin))
		if err := tr.LedgerItems(ctx, org, lo, hi, func(it Item) error { return r.Item(Ledger, it) }); err != nil {
			return Result{}, err
		}
		if err := tr.DayRollupItems(ctx, org, opt.From, opt.To, func(it Item) error { return r.Item(Aggregates, it) }); err != nil {
			return Result{}, err
		}
	}
	return r.Finish()
}
