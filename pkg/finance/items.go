package finance

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/usage"
)

// Item is one DynamoDB item, as the SDK types it: the export reader and the table reader hand
// the same values to the same decoding.
type Item = usage.Item

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
	_, org := it["org_id"].(*types.AttributeValueMemberS)
	if _, ok := it["entry_id"].(*types.AttributeValueMemberS); ok && org {
		return Ledger
	}
	if _, ok := it["generation_id"].(*types.AttributeValueMemberS); ok && org {
		if _, agg := it["pk"]; !agg {
			return Usage
		}
	}
	pk, _ := it["pk"].(*types.AttributeValueMemberS)
	sk, _ := it["sk"].(*types.AttributeValueMemberS)
	if pk != nil && sk != nil &&
		(strings.HasPrefix(sk.Value, dayPrefix) || strings.HasPrefix(sk.Value, monthPrefix) || strings.HasPrefix(pk.Value, markerPrefix)) {
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

// Entry is one ledger item: a debit (the entry ID is the generation id, the amount negative),
// a top-up or an adjustment.
type Entry struct {
	OrgID   string
	EntryID string
	Kind    string // "debit", "top_up", "adjustment"
	Amount  money.Amount
	At      time.Time
}

// Record is one usage item: the usage event and the UTC day it is aggregated under.
type Record struct {
	usage.Event
	Day string
}

// Rollup is one day × model roll-up of the aggregates table.
type Rollup struct {
	OrgID, Day, Model string
	usage.Totals
}

// Marker is one generation marker of the aggregates table: the fold added this generation's cost
// to the roll-ups of its organization and day.
type Marker struct {
	GenerationID, OrgID, Day string
	Cost                     money.Amount
}

// fields reads attributes of one item and remembers the first problem.
type fields struct {
	it  Item
	err error
}

func (f *fields) fail(name, want string) {
	if f.err == nil {
		f.err = fmt.Errorf("attribute %s: missing or not %s", name, want)
	}
}

func (f *fields) str(name string) string {
	v, ok := f.it[name].(*types.AttributeValueMemberS)
	if !ok {
		f.fail(name, "a string")
		return ""
	}
	return v.Value
}

// optStr reads a string that older items may lack.
func (f *fields) optStr(name string) string {
	if _, ok := f.it[name]; !ok {
		return ""
	}
	return f.str(name)
}

// num reads an integer number exactly: DynamoDB numbers are decimal strings, never floats here.
func (f *fields) num(name string) int64 {
	v, ok := f.it[name].(*types.AttributeValueMemberN)
	if !ok {
		f.fail(name, "a number")
		return 0
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		f.fail(name, "an integer")
	}
	return n
}

func (f *fields) optNum(name string) int64 {
	if _, ok := f.it[name]; !ok {
		return 0
	}
	return f.num(name)
}

// DecodeEntry reads a ledger item.
func DecodeEntry(it Item) (Entry, error) {
	f := fields{it: it}
	e := Entry{
		OrgID:   f.str("org_id"),
		EntryID: f.str("entry_id"),
		Kind:    f.str("kind"),
		Amount:  money.Amount(f.num("amount")),
		At:      time.Unix(0, f.num("at")).UTC(),
	}
	if f.err != nil {
		return Entry{}, fmt.Errorf("ledger item %s/%s: %w", e.OrgID, e.EntryID, f.err)
	}
	return e, nil
}

// DecodeRecord reads a usage item (usage.DecodePartialItem: exports may hold items older than
// some attributes). Its day is the item's own day attribute, which is the UTC day of started_at;
// an item without one gets that day.
func DecodeRecord(it Item) (Record, error) {
	f := fields{it: it}
	e, err := usage.DecodePartialItem(it)
	r := Record{Event: e, Day: f.optStr("day")}
	if err == nil {
		err = f.err
	}
	if err != nil {
		return Record{}, fmt.Errorf("usage item %s/%s: %w", f.optStr("org_id"), f.optStr("generation_id"), err)
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

// DecodeAggregate reads an aggregates item: a day roll-up or a marker (ok true), or a month
// roll-up (ok false: the reconciliation is per day).
func DecodeAggregate(it Item) (r *Rollup, m *Marker, err error) {
	f := fields{it: it}
	pk, sk := f.str("pk"), f.str("sk")
	switch {
	case strings.HasPrefix(pk, markerPrefix):
		m = &Marker{GenerationID: f.str("generation_id"), OrgID: f.str("org_id"), Day: f.str("day"), Cost: money.Amount(f.num("cost"))}
	case strings.HasPrefix(sk, dayPrefix):
		r = &Rollup{OrgID: pk, Day: f.str("day"), Model: f.optStr("model"), Totals: usage.Totals{
			Requests: f.num("requests"), PromptTokens: f.optNum("prompt_tokens"), CachedTokens: f.optNum("cached_tokens"),
			CompletionTokens: f.optNum("completion_tokens"), Cost: money.Amount(f.num("cost")),
		}}
	}
	if f.err != nil {
		return nil, nil, fmt.Errorf("aggregates item %s/%s: %w", pk, sk, f.err)
	}
	return r, m, nil
}
