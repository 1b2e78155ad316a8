package usage

import (
	"context"
	"errors"
	"fmt"

	"github.com/neocloud/kiln/pkg/money"
)

// Totals are what a roll-up counts. Cost is an exact sum of picodollars.
type Totals struct {
	Requests         int64        `json:"requests"`
	PromptTokens     int64        `json:"prompt_tokens"`
	CachedTokens     int64        `json:"cached_tokens"`
	CompletionTokens int64        `json:"completion_tokens"`
	Cost             money.Amount `json:"cost"`
}

// Add adds o to t, exactly; an overflowing cost is an error and leaves t unchanged.
func (t *Totals) Add(o Totals) error {
	cost, err := t.Cost.Add(o.Cost)
	if err != nil {
		return err
	}
	t.Requests += o.Requests
	t.PromptTokens += o.PromptTokens
	t.CachedTokens += o.CachedTokens
	t.CompletionTokens += o.CompletionTokens
	t.Cost = cost
	return nil
}

// TotalsOf is one event's contribution to a roll-up.
func TotalsOf(e Event) Totals {
	return Totals{Requests: 1, PromptTokens: e.PromptTokens, CachedTokens: e.CachedTokens,
		CompletionTokens: e.CompletionTokens, Cost: e.Cost}
}

// Month is the UTC calendar month ("2026-11") an event is aggregated under.
func (e Event) Month() string { return e.StartedAt.UTC().Format("2006-01") }

// Delta is what folding one event changes: its totals added to the organization's roll-up of its
// UTC day and model and to that of its UTC month, once per generation id.
type Delta struct {
	OrgID        string
	GenerationID string
	Day          string // "2026-11-29"
	Month        string // "2026-11"
	Model        string
	Totals
}

// DeltaOf is the delta of one event.
func DeltaOf(e Event) Delta {
	return Delta{OrgID: e.OrgID, GenerationID: e.GenerationID, Day: e.Day(), Month: e.Month(), Model: e.Model, Totals: TotalsOf(e)}
}

// Rollup is one row of the aggregates: an organization's totals for one UTC day and model
// (Day and Model set) or for one UTC month (Month set).
type Rollup struct {
	OrgID string `json:"org_id"`
	Day   string `json:"day,omitempty"`
	Month string `json:"month,omitempty"`
	Model string `json:"model"`
	Totals
}

// folder is the storage of the aggregates; both stores implement it (store.Aggregates). Fold
// writes a marker for the generation id and adds the delta to both roll-ups in one transaction;
// when the marker exists, nothing changes and it reports applied false.
type folder interface {
	Fold(ctx context.Context, d Delta) (applied bool, err error)
}

// Aggregator folds usage events into per organization × UTC day × model and per organization ×
// UTC month roll-ups (requests, tokens, exact cost), idempotent by generation id: a redelivered
// or reordered event changes nothing, because the marker of its generation id is written in the
// same transaction as the additions. It is the Recorder of the aggregator function and of the
// local gateway's in-process pipe.
type Aggregator struct {
	store folder
}

// NewAggregator returns an Aggregator on store.
func NewAggregator(store folder) *Aggregator {
	return &Aggregator{store: store}
}

// batchFolder is a store that folds many deltas in few writes: the DynamoDB store puts up to a
// hundred items in one transaction, where one event alone takes three. FoldBatch returns, in
// order, whether each delta changed the aggregates; on an error, those of a prefix of ds, the
// deltas it handled before the error.
type batchFolder interface {
	FoldBatch(ctx context.Context, ds []Delta) ([]bool, error)
}

// RecordBatch folds each of es once and returns, in the same order, the error of each event that
// was not recorded (nil for those recorded now or before). On a store that folds in batches
// (the DynamoDB store), the valid events go to it together; otherwise one by one.
func (a *Aggregator) RecordBatch(ctx context.Context, es []Event) []error {
	errs := make([]error, len(es))
	bf, ok := a.store.(batchFolder)
	if !ok {
		for i, e := range es {
			_, errs[i] = a.Fold(ctx, e)
		}
		return errs
	}
	var ds []Delta
	var at []int // the index in es of each delta
	for i, e := range es {
		if err := check(e); err != nil {
			errs[i] = err
			continue
		}
		ds = append(ds, DeltaOf(e))
		at = append(at, i)
	}
	if len(ds) == 0 {
		return errs
	}
	done, err := bf.FoldBatch(ctx, ds)
	if err == nil && len(done) < len(ds) {
		err = fmt.Errorf("fold: the store handled %d of %d events", len(done), len(ds))
	}
	for k := len(done); k < len(ds); k++ {
		errs[at[k]] = err // not folded: to be delivered again
	}
	return errs
}

// check refuses an event that cannot be folded.
func check(e Event) error {
	switch {
	case e.OrgID == "" || e.GenerationID == "":
		return errors.New("fold: event without organization or generation id")
	case e.StartedAt.IsZero():
		return fmt.Errorf("fold %s: no start time", e.GenerationID)
	case e.Cost < 0:
		return fmt.Errorf("fold %s: negative cost", e.GenerationID)
	}
	return nil
}

// Fold folds e and reports whether it changed the aggregates (false for a generation already
// folded).
func (a *Aggregator) Fold(ctx context.Context, e Event) (bool, error) {
	if err := check(e); err != nil {
		return false, err
	}
	applied, err := a.store.Fold(ctx, DeltaOf(e))
	if err != nil {
		return false, err // the store names the generation
	}
	return applied, nil
}
