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
	fromArg := f.String("from", "", "the first UTC `DAY`, such as 2026-11-01 (required)")
	toArg := f.String("to", "", "the last UTC `DAY`, included (required)")
	by := f.String("by", "", "roll up per `day` or per model instead of listing events")
	asCSV := f.Bool("csv", false, "print CSV with a header row")
	if _, err := f.parse(args); err != nil {
		return err
	}
	switch {
	case *fromArg == "" || *toArg == "":
		return f.usageErr("--from and --to are required")
	case *by != "" && *by != "day" && *by != "model":
		return f.usageErr("--by %q: want day or model", *by)
	case *asCSV && *f.json:
		return f.usageErr("--csv and --json exclude each other")
	}
	from, to, err := days(f, *fromArg, *toArg)
	if err != nil {
		return err
	}
	st, _, err := c.storeAndOrg(ctx, *orgID)
	if err != nil {
		return err
	}
	if *by == "" {
		events, err := st.Usage(ctx, *orgID, from, to.AddDate(0, 0, 1))
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
	daily, err := st.DailyRollups(ctx, *orgID, *fromArg, *toArg)
	if err != nil {
		return fmt.Errorf("usage of %s: %w", *orgID, err)
	}
	r := rollup{OrgID: *orgID, From: *fromArg, To: *toArg, By: *by, Rows: []rollupRow{}}
	groups := map[string]*usage.Totals{}
	for _, d := range daily {
		k := d.Day
		if *by == "model" {
			k = d.Model
		}
		if groups[k] == nil {
			groups[k] = &usage.Totals{}
		}
		if err := groups[k].Add(d.Totals); err != nil {
			return fmt.Errorf("sum cost of %s: %w", k, err)
		}
		if err := r.Total.Add(d.Totals); err != nil {
			return fmt.Errorf("sum cost: %w", err)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		row := rollupRow{Totals: *groups[k]}
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
	return writeRollup(c.stdout, *by, groups, r.Total, *asCSV)
}

// writeRollup writes the totals of each group, in the order of their keys, as CSV or as a text
// table with a total row: usage --by and finance report --by write the same columns.
func writeRollup(w io.Writer, by string, groups map[string]*usage.Totals, total usage.Totals, asCSV bool) error {
	keys := slices.Sorted(maps.Keys(groups))
	if asCSV {
		rows := make([][]string, 0, len(keys))
		for _, k := range keys {
			rows = append(rows, append(append([]string{k}, cells(*groups[k])...), groups[k].Cost.String()))
		}
		return writeCSV(w, []string{by, "requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost"}, rows)
	}
	t := newTable(w, strings.ToUpper(by), "REQUESTS", "PROMPT", "CACHED", "COMPLETION", "COST USD")
	for _, k := range keys {
		t.row(append(append([]string{orNone(k)}, cells(*groups[k])...), usd(groups[k].Cost))...)
	}
	t.row(append(append([]string{"total"}, cells(total)...), usd(total.Cost))...)
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
