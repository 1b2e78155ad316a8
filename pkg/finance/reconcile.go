package finance

import (
	"bufio"
	"cmp"
	"encoding/gob"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/usage"
)

// Kinds of difference a reconciliation finds.
const (
	// DebitWithoutUsage: a debit of a generation that has no usage record.
	DebitWithoutUsage = "debit_without_usage"
	// UsageWithoutDebit: a usage record with a cost and no debit.
	UsageWithoutDebit = "usage_without_debit"
	// DebitDiffers: the debit is not the usage record's cost.
	DebitDiffers = "debit_differs"
	// NotAggregated: a usage record the aggregates have no marker of (the fold never saw it).
	NotAggregated = "not_aggregated"
	// AggregatedWithoutUsage: a marker of a generation that has no usage record.
	AggregatedWithoutUsage = "aggregated_without_usage"
	// AggregateDiffers: the marker's cost, or its day, is not the usage record's.
	AggregateDiffers = "aggregate_differs"
	// RollupDiffers: an organization's day roll-ups are not the sum of its usage records of the
	// day, by an amount that no generation's own difference explains.
	RollupDiffers = "rollup_differs"
	// Duplicate: the same record twice (two copies of one export at one location).
	Duplicate = "duplicate"
)

// Difference is one thing that does not agree. Amounts are what each source holds, nil where it
// holds nothing; the ledger's is the debit as a positive amount.
type Difference struct {
	Kind         string        `json:"kind"`
	OrgID        string        `json:"org_id"`
	Day          string        `json:"day"`
	GenerationID string        `json:"generation_id,omitempty"`
	Ledger       *money.Amount `json:"ledger"`
	Usage        *money.Amount `json:"usage"`
	Aggregate    *money.Amount `json:"aggregate"`
}

// Row is one organization × UTC day: the ledger's debits of that day's generations, the costs of
// that day's usage records and of its roll-ups.
type Row struct {
	OrgID      string        `json:"org_id"`
	Day        string        `json:"day"`
	Requests   int64         `json:"requests"`
	Ledger     money.Amount  `json:"ledger"`
	Usage      money.Amount  `json:"usage"`
	Aggregates *money.Amount `json:"aggregates"` // nil when the aggregates were not reconciled
	Agrees     bool          `json:"agrees"`
}

// Result is a reconciliation: every organization × day, and every difference (the first
// MaxListed of them listed; DifferenceCount counts them all).
type Result struct {
	From            string       `json:"from"`
	To              string       `json:"to"`
	Agrees          bool         `json:"agrees"`
	Rows            []Row        `json:"rows"`
	Differences     []Difference `json:"differences"`
	DifferenceCount int          `json:"difference_count"`
	InProgress      int64        `json:"in_progress_skipped"` // usage items of requests still running
}

// Options bound a reconciliation.
type Options struct {
	From, To string // UTC days, both included
	// Aggregates says whether the roll-ups are reconciled too; Markers, whether generation
	// markers come with them (an export has them; the scheduled run over the tables reads
	// only the roll-ups and compares them with the usage records).
	Aggregates, Markers bool
	Partitions          int // spill files, in os.TempDir(); 0 is 64
	MaxListed           int // differences listed; 0 is 1000
}

// Reconciler matches debits, usage records and markers per generation and sums them per
// organization × day. Memory stays bounded whatever the number of generations: each record goes
// to one of Partitions spill files by a hash of its generation, and Finish joins one file at a
// time, so a file holds about 1/Partitions of the generations (a record is about 60 bytes).
// The roll-ups are summed in memory: one number per organization × day.
type Reconciler struct {
	opt        Options
	from, to   int32 // day numbers
	dir        string
	files      []*os.File
	bufs       []*bufio.Writer
	encs       []*gob.Encoder // one gob stream of spilled records per file
	rollups    map[orgDay]money.Amount
	inProgress int64
	// afterPartition, when set, runs while a joined partition is still in memory (tests sample
	// the heap there).
	afterPartition func()
}

type orgDay struct {
	org string
	day int32
}

// NewReconciler starts a reconciliation of the days opt.From..opt.To.
func NewReconciler(opt Options) (*Reconciler, error) {
	from, err := dayNumber(opt.From)
	if err != nil {
		return nil, fmt.Errorf("from %q: want a day such as 2026-11-01", opt.From)
	}
	to, err := dayNumber(opt.To)
	if err != nil {
		return nil, fmt.Errorf("to %q: want a day such as 2026-11-30", opt.To)
	}
	if to < from {
		return nil, fmt.Errorf("to %s is before from %s", opt.To, opt.From)
	}
	if opt.Partitions <= 0 {
		opt.Partitions = 64
	}
	if opt.MaxListed <= 0 {
		opt.MaxListed = 1000
	}
	dir, err := os.MkdirTemp("", "kiln-reconcile-")
	if err != nil {
		return nil, err
	}
	r := &Reconciler{opt: opt, from: from, to: to, dir: dir, rollups: map[orgDay]money.Amount{}}
	for i := range opt.Partitions {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("p%03d", i)))
		if err != nil {
			r.Close()
			return nil, err
		}
		r.files = append(r.files, f)
		r.bufs = append(r.bufs, bufio.NewWriterSize(f, 32<<10))
		r.encs = append(r.encs, gob.NewEncoder(r.bufs[i]))
	}
	return r, nil
}

// Close removes the spill files.
func (r *Reconciler) Close() error {
	for _, f := range r.files {
		f.Close()
	}
	r.files = nil
	return os.RemoveAll(r.dir)
}

// Record kinds in the spill files.
const (
	kindDebit byte = iota + 1
	kindUsage
	kindMarker
)

// Item adds one item of the given table, decoded. Only debits of the ledger are reconciled
// (top-ups and adjustments are no usage); a debit counts on its generation's day, or, for a
// generation with no usage record, on the day it was written. Debits written after the last
// day may belong to it (a request that ran over midnight), and usage records of the day before
// the first are kept to match them; earlier ones cannot. Records of requests still running are
// skipped and counted. The aggregates are day × model roll-ups and generation markers.
func (r *Reconciler) Item(t Table, it Item) error {
	switch t {
	case Ledger:
		e, err := DecodeEntry(it)
		if err != nil {
			return err
		}
		if day := int32(dayOf(e.At)); e.Kind == store.EntryDebit && day >= r.from && day <= r.to+1 {
			return r.spill(kindDebit, e.OrgID, e.ID, day, -e.Amount)
		}
	case Usage:
		rec, err := DecodeRecord(it)
		if err != nil {
			return err
		}
		if rec.InProgress() {
			r.inProgress++
			return nil
		}
		day, err := dayNumber(rec.Day)
		if err != nil {
			return fmt.Errorf("usage item %s/%s: day %q", rec.OrgID, rec.GenerationID, rec.Day)
		}
		if day >= r.from-1 && day <= r.to {
			return r.spill(kindUsage, rec.OrgID, rec.GenerationID, day, rec.Cost)
		}
	case Aggregates:
		ro, m, err := DecodeAggregate(it)
		switch {
		case err != nil:
			return err
		case ro != nil:
			return r.rollup(*ro)
		case m != nil:
			day, err := dayNumber(m.Day)
			if err != nil {
				return fmt.Errorf("marker of %s: day %q", m.GenerationID, m.Day)
			}
			if day >= r.from && day <= r.to {
				return r.spill(kindMarker, m.OrgID, m.GenerationID, day, m.Cost)
			}
		}
	}
	return nil
}

// rollup adds a day × model roll-up to its organization × day's sum.
func (r *Reconciler) rollup(ro usage.Rollup) error {
	day, err := dayNumber(ro.Day)
	if err != nil {
		return fmt.Errorf("roll-up of %s: day %q", ro.OrgID, ro.Day)
	}
	if day < r.from || day > r.to {
		return nil
	}
	k := orgDay{ro.OrgID, day}
	sum, err := r.rollups[k].Add(ro.Cost)
	if err != nil {
		return fmt.Errorf("roll-ups of %s on %s: %w", ro.OrgID, ro.Day, err)
	}
	r.rollups[k] = sum
	return nil
}

func (r *Reconciler) spill(kind byte, org, gen string, day int32, amount money.Amount) error {
	h := fnv.New32a()
	h.Write([]byte(org))
	h.Write([]byte{0})
	h.Write([]byte(gen))
	return r.encs[h.Sum32()%uint32(len(r.encs))].Encode(spilled{org, gen, kind, day, amount})
}

// spilled is one record of a spill file.
type spilled struct {
	Org, Gen string
	Kind     byte
	Day      int32
	Amount   money.Amount
}

// generation is what the sources hold of one generation: its debit, usage record and marker,
// by record kind.
type generation struct {
	org, id string
	of      [kindMarker + 1]held
}

// held is what one source holds of a generation: whether it holds it at all, or twice, and its
// amount and day.
type held struct {
	has, dup bool
	amount   money.Amount
	day      int32
}

// figures are one organization × day's sums.
type figures struct {
	requests              int64
	ledger, usage, marker money.Amount
}

// Finish joins the generations and returns the result. The Reconciler is closed after it.
func (r *Reconciler) Finish() (Result, error) {
	defer r.Close()
	sums := map[orgDay]*figures{}
	diffs := []Difference{} // [] in JSON, not null, when none differ
	count := 0
	add := func(d Difference) {
		count++
		if len(diffs) < r.opt.MaxListed {
			diffs = append(diffs, d)
		}
	}
	var sumErr error
	plus := func(to *money.Amount, a money.Amount) {
		s, err := to.Add(a)
		if err != nil && sumErr == nil {
			sumErr = err
		}
		*to = s
	}
	at := func(org string, day int32) *figures {
		k := orgDay{org, day}
		if sums[k] == nil {
			sums[k] = &figures{}
		}
		return sums[k]
	}
	for i, w := range r.bufs {
		if err := w.Flush(); err != nil {
			return Result{}, err
		}
		gens, err := readPartition(r.files[i])
		if err != nil {
			return Result{}, err
		}
		if r.afterPartition != nil {
			r.afterPartition()
		}
		for _, g := range gens {
			debit, use, mk := g.of[kindDebit], g.of[kindUsage], g.of[kindMarker]
			if use.has {
				if use.day < r.from {
					continue // kept only to match a debit written after midnight
				}
				day := dayString(use.day)
				f := at(g.org, use.day)
				f.requests++
				plus(&f.usage, use.amount)
				if use.dup || debit.dup || mk.dup {
					add(Difference{Kind: Duplicate, OrgID: g.org, Day: day, GenerationID: g.id})
				}
				switch {
				case debit.has:
					plus(&f.ledger, debit.amount)
					if debit.amount != use.amount {
						add(Difference{Kind: DebitDiffers, OrgID: g.org, Day: day, GenerationID: g.id, Ledger: new(debit.amount), Usage: new(use.amount)})
					}
				case use.amount != 0:
					add(Difference{Kind: UsageWithoutDebit, OrgID: g.org, Day: day, GenerationID: g.id, Usage: new(use.amount)})
				}
				if r.opt.Aggregates && r.opt.Markers {
					switch {
					case !mk.has:
						add(Difference{Kind: NotAggregated, OrgID: g.org, Day: day, GenerationID: g.id, Usage: new(use.amount)})
					default:
						if mk.day == use.day {
							plus(&f.marker, mk.amount)
						} else {
							plus(&at(g.org, mk.day).marker, mk.amount)
						}
						if mk.amount != use.amount || mk.day != use.day {
							add(Difference{Kind: AggregateDiffers, OrgID: g.org, Day: day, GenerationID: g.id, Usage: new(use.amount), Aggregate: new(mk.amount)})
						}
					}
				}
				continue
			}
			if debit.has && debit.day >= r.from && debit.day <= r.to {
				plus(&at(g.org, debit.day).ledger, debit.amount)
				add(Difference{Kind: DebitWithoutUsage, OrgID: g.org, Day: dayString(debit.day), GenerationID: g.id, Ledger: new(debit.amount)})
			}
			if mk.has && r.opt.Aggregates && r.opt.Markers {
				plus(&at(g.org, mk.day).marker, mk.amount)
				add(Difference{Kind: AggregatedWithoutUsage, OrgID: g.org, Day: dayString(mk.day), GenerationID: g.id, Aggregate: new(mk.amount)})
			}
		}
	}
	if sumErr != nil {
		return Result{}, fmt.Errorf("sum: %w", sumErr)
	}
	res := Result{From: r.opt.From, To: r.opt.To, InProgress: r.inProgress, Rows: []Row{}}
	if r.opt.Aggregates {
		for k := range r.rollups {
			at(k.org, k.day)
		}
	}
	for k, f := range sums {
		row := Row{OrgID: k.org, Day: dayString(k.day), Requests: f.requests, Ledger: f.ledger, Usage: f.usage}
		row.Agrees = f.ledger == f.usage
		if r.opt.Aggregates {
			ro := r.rollups[k]
			row.Aggregates = &ro
			// With markers, roll-ups that match them are explained by the generations' own
			// differences, listed one by one; otherwise they are off by what none explains.
			if ro != f.usage && (!r.opt.Markers || ro != f.marker) {
				add(Difference{Kind: RollupDiffers, OrgID: k.org, Day: row.Day, Usage: new(f.usage), Aggregate: &ro})
			}
			row.Agrees = row.Agrees && ro == f.usage
		}
		res.Rows = append(res.Rows, row)
	}
	slices.SortFunc(res.Rows, func(a, b Row) int {
		return cmp.Or(strings.Compare(a.OrgID, b.OrgID), strings.Compare(a.Day, b.Day))
	})
	slices.SortFunc(diffs, func(a, b Difference) int {
		return cmp.Or(strings.Compare(a.OrgID, b.OrgID), strings.Compare(a.Day, b.Day),
			strings.Compare(a.Kind, b.Kind), strings.Compare(a.GenerationID, b.GenerationID))
	})
	res.Differences = diffs
	res.DifferenceCount = count
	res.Agrees = count == 0
	for _, row := range res.Rows {
		res.Agrees = res.Agrees && row.Agrees
	}
	return res, nil
}

// readPartition reads one spill file back into its generations.
func readPartition(f *os.File) (map[string]*generation, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	dec := gob.NewDecoder(bufio.NewReaderSize(f, 64<<10))
	gens := map[string]*generation{}
	for {
		var s spilled // a fresh one: gob leaves out zero fields
		if err := dec.Decode(&s); errors.Is(err, io.EOF) {
			return gens, nil
		} else if err != nil {
			return nil, fmt.Errorf("read spill file: %w", err)
		}
		key := s.Org + "\x00" + s.Gen
		g := gens[key]
		if g == nil {
			g = &generation{org: s.Org, id: s.Gen}
			gens[key] = g
		}
		h := &g.of[s.Kind]
		h.has, h.dup, h.amount, h.day = true, h.has, s.Amount, s.Day
	}
}

// dayNumber is the number of days since 1970-01-01 of a UTC day "2026-11-29".
func dayNumber(day string) (int32, error) {
	t, err := time.Parse(time.DateOnly, day)
	if err != nil {
		return 0, err
	}
	return int32(dayOf(t)), nil
}

func dayOf(t time.Time) int64 {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC).Unix() / 86400
}

func dayString(n int32) string { return time.Unix(int64(n)*86400, 0).UTC().Format(time.DateOnly) }
