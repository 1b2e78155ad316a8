package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/neocloud/kiln/pkg/usage"
)

func cells(t usage.Totals) []string {
	return []string{
		strconv.FormatInt(t.Requests, 10),
		strconv.FormatInt(t.PromptTokens, 10),
		strconv.FormatInt(t.CachedTokens, 10),
		strconv.FormatInt(t.CompletionTokens, 10),
	}
}

// rollupRow is one group of a roll-up: a day ("2026-11-29") or a model.
type rollupRow struct {
	Day   string  `json:"day,omitempty"`
	Model *string `json:"model,omitempty"`
	usage.Totals
}

// rollup is what usage --by prints.
type rollup struct {
	OrgID string       `json:"org_id"`
	From  string       `json:"from"`
	To    string       `json:"to"`
	By    string       `json:"by"`
	Rows  []rollupRow  `json:"rows"`
	Total usage.Totals `json:"total"`
}

func usageReport(ctx context.Context, c *cli, f *flags, args []string) error {
	orgID := f.org()
	days := f.period()
	by := f.String("by", "", "roll up per `day` or per model instead of listing events")
	asCSV := f.csvFlag("print CSV with a header row")
	if _, err := f.parse(args); err != nil {
		return err
	}
	if *by != "" && *by != "day" && *by != "model" {
		return f.usageErr("--by %q: want day or model", *by)
	}
	st, _, err := c.storeAndOrg(ctx, *orgID)
	if err != nil {
		return err
	}
	if *by == "" {
		events, err := st.Usage(ctx, *orgID, days.first, days.last.AddDate(0, 0, 1))
		if err != nil {
			return fmt.Errorf("usage of %s: %w", *orgID, err)
		}
		slices.SortStableFunc(events, func(a, b usage.Event) int { return a.StartedAt.Compare(b.StartedAt) })
		for i := range events {
			events[i].StartedAt = events[i].StartedAt.UTC()
		}
		return c.listEvents(f, events, *asCSV)
	}

	// The roll-ups come from the aggregates (the usage pipeline's fold), not from the events:
	// one row per day and model, however many requests.
	daily, err := st.DailyRollups(ctx, *orgID, days.from, days.to)
	if err != nil {
		return fmt.Errorf("usage of %s: %w", *orgID, err)
	}
	var g groups
	for _, d := range daily {
		k := d.Day
		if *by == "model" {
			k = d.Model
		}
		if err := g.add(k, d.Totals); err != nil {
			return fmt.Errorf("sum cost of %s: %w", k, err)
		}
	}
	r := rollup{OrgID: *orgID, From: days.from, To: days.to, By: *by, Rows: []rollupRow{}, Total: g.total}
	for _, k := range g.keys() {
		row := rollupRow{Totals: *g.of[k]}
		if *by == "day" {
			row.Day = k
		} else {
			row.Model = &k
		}
		r.Rows = append(r.Rows, row)
	}
	if *f.json {
		return writeJSON(c.stdout, r)
	}
	return writeRollup(c.stdout, *by, g, *asCSV)
}

// groups are the totals of a roll-up per key (a day, a model or an organization) and in all.
type groups struct {
	of    map[string]*usage.Totals
	total usage.Totals
}

// add adds t to the totals of key and to the total.
func (g *groups) add(key string, t usage.Totals) error {
	if g.of[key] == nil {
		if g.of == nil {
			g.of = map[string]*usage.Totals{}
		}
		g.of[key] = &usage.Totals{}
	}
	if err := g.of[key].Add(t); err != nil {
		return err
	}
	return g.total.Add(t)
}

func (g *groups) keys() []string { return slices.Sorted(maps.Keys(g.of)) }

// writeRollup writes the totals of each group, in the order of their keys, as CSV or as a text
// table with a total row: usage --by and finance report --by write the same columns.
func writeRollup(w io.Writer, by string, g groups, asCSV bool) error {
	if asCSV {
		rows := make([][]string, 0, len(g.of))
		for _, k := range g.keys() {
			rows = append(rows, append(append([]string{k}, cells(*g.of[k])...), g.of[k].Cost.String()))
		}
		return writeCSV(w, []string{by, "requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost"}, rows)
	}
	t := newTable(w, strings.ToUpper(by), "REQUESTS", "PROMPT", "CACHED", "COMPLETION", "COST USD")
	for _, k := range g.keys() {
		t.row(append(append([]string{orNone(k)}, cells(*g.of[k])...), usd(g.of[k].Cost))...)
	}
	t.row(append(append([]string{"total"}, cells(g.total)...), usd(g.total.Cost))...)
	return t.flush()
}

// eventColumns are the CSV columns of usage events: the event's wire names (contract section 8).
var eventColumns = []string{
	"generation_id", "org_id", "key_id", "model", "endpoint", "stream", "status", "http_status",
	"finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens", "cost", "estimated",
	"started_at", "ttft_ms", "duration_ms", "backend",
}

// eventRow is an event's CSV record, in the order of eventColumns.
func eventRow(e usage.Event) []string {
	return []string{
		e.GenerationID, e.OrgID, e.KeyID, e.Model, e.Endpoint, strconv.FormatBool(e.Stream),
		string(e.Status), strconv.Itoa(e.HTTPStatus), e.FinishReason,
		strconv.FormatInt(e.PromptTokens, 10), strconv.FormatInt(e.CachedTokens, 10),
		strconv.FormatInt(e.CompletionTokens, 10), e.Cost.String(), strconv.FormatBool(e.Estimated),
		exactTime(e.StartedAt), strconv.FormatInt(e.TTFTMillis, 10),
		strconv.FormatInt(e.DurationMillis, 10), e.Backend,
	}
}

func (c *cli) listEvents(f *flags, events []usage.Event, asCSV bool) error {
	switch {
	case *f.json:
		if events == nil {
			events = []usage.Event{}
		}
		return writeJSON(c.stdout, events)
	case asCSV:
		rows := make([][]string, 0, len(events))
		for _, e := range events {
			rows = append(rows, eventRow(e))
		}
		return writeCSV(c.stdout, eventColumns, rows)
	}
	var sum usage.Totals
	t := newTable(c.stdout, "STARTED", "GENERATION", "MODEL", "STATUS", "PROMPT", "CACHED", "COMPLETION", "COST USD")
	for _, e := range events {
		if err := sum.Add(usage.TotalsOf(e)); err != nil {
			return fmt.Errorf("sum cost at generation %s: %w", e.GenerationID, err)
		}
		t.row(shortTime(e.StartedAt), e.GenerationID, orNone(e.Model), string(e.Status),
			strconv.FormatInt(e.PromptTokens, 10), strconv.FormatInt(e.CachedTokens, 10),
			strconv.FormatInt(e.CompletionTokens, 10), usd(e.Cost))
	}
	if err := t.flush(); err != nil {
		return err
	}
	return c.printf("%d requests, %s USD\n", sum.Requests, usd(sum.Cost))
}
