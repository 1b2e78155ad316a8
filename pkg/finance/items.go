package finance

import (
	"fmt"
	"strings"
	"time"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Item is one DynamoDB item, as the SDK types it: the export reader and the table reader hand
// the same values to the same decoding.
type Item = ddbitem.Item

// Table is which of the store's tables an item comes from, told by the item's own shape
// (docs/dynamodb.md), so that an export is read the same with or without its manifests.
type Table int

const (
	// Other is an item of none of the tables finance reads (organizations, keys).
	Other Table = iota
	Ledger
	Usage
	Aggregates
)

func (t Table) String() string {
	switch t {
	case Ledger:
		return "ledger"
	case Usage:
		return "usage"
	case Aggregates:
		return "aggregates"
	}
	return "other"
}

// TableOf tells an item's table from its key attributes: ledger items are keyed by org_id and
// entry_id, usage items by org_id and generation_id, aggregates by pk and sk with sk a day or
// month roll-up or pk a generation marker. The organizations table also has pk and sk, but
// neither of those forms.
func TableOf(it Item) Table {
	f := ddbitem.NewReader(it)
	org, pk, sk := f.OptStr("org_id"), f.OptStr("pk"), f.OptStr("sk")
	switch {
	case org != "" && f.OptStr("entry_id") != "":
		return Ledger
	case org != "" && f.OptStr("generation_id") != "" && !f.Has("pk"):
		return Usage
	case pk != "" && sk != "" && (strings.HasPrefix(sk, dayPrefix) || strings.HasPrefix(sk, monthPrefix) || strings.HasPrefix(pk, markerPrefix)):
		return Aggregates
	}
	return Other
}

// The aggregates table's key forms (pkg/store/dynamo/aggregates.go).
const (
	dayPrefix    = "day#"
	monthPrefix  = "month#"
	markerPrefix = "gen#"
)

// Record is one usage item: the usage event and the UTC day it is aggregated under.
type Record struct {
	usage.Event
	Day string
}

// Marker is one generation marker of the aggregates table: the fold added this generation's cost
// to the roll-ups of its organization and day.
type Marker struct {
	GenerationID, OrgID, Day string
	Cost                     money.Amount
}

// DecodeEntry reads a ledger item: a debit (the entry ID is the generation id, the amount
// negative), a top-up or an adjustment. Its note, which no report needs, is not read.
func DecodeEntry(it Item) (store.LedgerEntry, error) {
	f := ddbitem.NewReader(it)
	e := store.LedgerEntry{
		OrgID:  f.Str("org_id"),
		ID:     f.Str("entry_id"),
		Kind:   store.EntryKind(f.Str("kind")),
		Amount: money.Amount(f.Num("amount")),
		At:     store.FromUnixNanos(f.Num("at")),
	}
	if err := f.Err(); err != nil {
		return store.LedgerEntry{}, fmt.Errorf("ledger item %s/%s: %w", e.OrgID, e.ID, err)
	}
	return e, nil
}

// DecodeRecord reads a usage item (usage.DecodePartialItem: exports may hold items older than
// some attributes). Its day is the item's own day attribute, which is the UTC day of started_at;
// an item without one gets that day.
func DecodeRecord(it Item) (Record, error) {
	f := ddbitem.NewReader(it)
	e, err := usage.DecodePartialItem(it)
	r := Record{Event: e, Day: f.OptStr("day")}
	if err == nil {
		err = f.Err()
	}
	if err != nil {
		return Record{}, fmt.Errorf("usage item %s/%s: %w", f.OptStr("org_id"), f.OptStr("generation_id"), err)
	}
	if r.Day == "" {
		r.Day = r.StartedAt.Format(time.DateOnly)
	}
	if !r.InProgress() && r.Cost < 0 {
		return Record{}, fmt.Errorf("usage item %s/%s: negative cost %s", r.OrgID, r.GenerationID, r.Cost)
	}
	return r, nil
}

// InProgress reports whether the record is of a request still running: not yet a usage record,
// and so skipped by reports and reconciliations.
func (r Record) InProgress() bool { return r.Status == usage.StatusInProgress }

// DecodeAggregate reads an aggregates item: a day roll-up or a marker, or neither for a month
// roll-up (the reconciliation is per day).
func DecodeAggregate(it Item) (r *usage.Rollup, m *Marker, err error) {
	f := ddbitem.NewReader(it)
	pk, sk := f.Str("pk"), f.Str("sk")
	switch {
	case strings.HasPrefix(pk, markerPrefix):
		m = &Marker{GenerationID: f.Str("generation_id"), OrgID: f.Str("org_id"), Day: f.Str("day"), Cost: money.Amount(f.Num("cost"))}
	case strings.HasPrefix(sk, dayPrefix):
		r = &usage.Rollup{OrgID: pk, Day: f.Str("day"), Model: f.OptStr("model"), Totals: usage.Totals{
			Requests: f.Num("requests"), PromptTokens: f.OptNum("prompt_tokens"), CachedTokens: f.OptNum("cached_tokens"),
			CompletionTokens: f.OptNum("completion_tokens"), Cost: money.Amount(f.Num("cost")),
		}}
	}
	if err = f.Err(); err != nil {
		return nil, nil, fmt.Errorf("aggregates item %s/%s: %w", pk, sk, err)
	}
	return r, m, nil
}
