package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/finance"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/usage"
)

// exitDiffers is the exit status of finance reconcile when the figures do not agree: the
// command worked, and what it found is not what finance wants.
const exitDiffers = 3

// exitCode makes kilnctl exit with a status of its own after printing its output.
type exitCode struct {
	code int
	msg  string
}

func (e *exitCode) Error() string { return e.msg }

// financeExport answers "kilnctl finance export": point-in-time exports of the ledger, usage
// and aggregates tables to S3, awaited, with progress on stderr.
func financeExport(ctx context.Context, c *cli, f *flags, args []string) error {
	bucket := f.required("bucket", "the S3 `BUCKET` to export to (required)")
	prefix := f.String("prefix", "", "the key `PREFIX` in the bucket; each table goes under PREFIX/TABLE/ (required)")
	atArg := f.String("at", "", "the point in `TIME` to export (RFC 3339, within the last 35 days); default now")
	poll := f.Duration("poll", 10*time.Second, "how often to look at the exports' progress")
	if _, err := f.parse(args); err != nil {
		return err
	}
	switch {
	case strings.Contains(*bucket, "/") || strings.HasPrefix(*bucket, "s3:"):
		return f.usageErr("--bucket %q: a bucket name, without s3:// or a prefix", *bucket)
	case strings.Trim(*prefix, "/") == "":
		return f.usageErr("--prefix is required: the exports of different days must not share one")
	case *poll <= 0:
		return f.usageErr("--poll %s: want a positive duration", *poll)
	}
	var at time.Time
	if *atArg != "" {
		t, err := time.Parse(time.RFC3339Nano, *atArg)
		if err != nil {
			return f.usageErr("--at %q: want a time such as 2026-12-01T00:00:00Z", *atArg)
		}
		if t.After(c.clock()) {
			return f.usageErr("--at %s is in the future", *atArg)
		}
		at = t.UTC()
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	if cfg.Store != config.StoreDynamoDB {
		return fmt.Errorf("KILN_STORE=%q: finance export exports the DynamoDB tables; set KILN_STORE=dynamodb", cfg.Store)
	}
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	ds := st.(*dynamo.Store) // KILN_STORE=dynamodb opens nothing else
	t := ds.Tables()
	location := "s3://" + *bucket + "/" + strings.Trim(*prefix, "/") + "/"
	fmt.Fprintf(c.stderr, "exporting %s, %s and %s (DynamoDB on %s) to %s\n", t.Ledger, t.Usage, t.Aggregates, cmp.Or(cfg.DynamoDBEndpoint, "AWS"), location)
	infos, err := finance.StartExports(ctx, ds.Client(), finance.ExportRequest{
		Tables: []string{t.Ledger, t.Usage, t.Aggregates}, Bucket: *bucket, Prefix: *prefix, At: at,
		Poll: *poll, Progress: c.stderr,
	})
	if err != nil {
		return err
	}
	if *f.json {
		return writeJSON(c.stdout, struct {
			Location string               `json:"location"`
			Exports  []finance.ExportInfo `json:"exports"`
		}{location, infos})
	}
	tw := newTable(c.stdout, "TABLE", "ITEMS", "EXPORT TIME", "LOCATION")
	for _, in := range infos {
		at := "-"
		if !in.ExportAt.IsZero() {
			at = exactTime(in.ExportAt)
		}
		tw.row(in.Table, strconv.FormatInt(in.Items, 10), at, in.Location)
	}
	if err := tw.flush(); err != nil {
		return err
	}
	return c.printf("\nkilnctl finance report --export %s --from DAY --to DAY\nkilnctl finance reconcile --export %s --from DAY --to DAY\n", location, location)
}

// openExport opens the export an --export flag names: s3://BUCKET/PREFIX or a directory.
func (c *cli) openExport(ctx context.Context, where string) (*finance.Export, error) {
	var client *s3.Client
	if strings.HasPrefix(where, "s3://") {
		cfg, err := c.config()
		if err != nil {
			return nil, err
		}
		s3c, err := finance.OpenS3(ctx, cfg.S3Endpoint, cfg.Region)
		if err != nil {
			return nil, err
		}
		client = s3c
	}
	return finance.Open(ctx, where, client)
}

// financeReport answers "kilnctl finance report": the usage records of an export, listed or
// rolled up, read as a stream.
func financeReport(ctx context.Context, c *cli, f *flags, args []string) error {
	where := f.required("export", "the export's `LOCATION`: s3://BUCKET/PREFIX, or a directory holding a copy of it (required)")
	days := f.period()
	orgID := f.String("org", "", "only this organization's `ID`")
	by := f.String("by", "", "roll up per `day`, model or org instead of listing records")
	asCSV := f.csvFlag("print CSV with a header row (the columns of kilnctl usage --csv)")
	if _, err := f.parse(args); err != nil {
		return err
	}
	if *by != "" && *by != "day" && *by != "model" && *by != "org" {
		return f.usageErr("--by %q: want day, model or org", *by)
	}
	x, err := c.openExport(ctx, *where)
	if err != nil {
		return err
	}
	out := bufio.NewWriterSize(c.stdout, 64<<10)
	var inProgress int64
	if *by == "" {
		w, err := newRecordWriter(out, *asCSV, *f.json)
		if err != nil {
			return err
		}
		if inProgress, err = x.Records(ctx, days.from, days.to, *orgID, w.write); err != nil {
			return err
		}
		if err := w.close(); err != nil {
			return err
		}
	} else {
		var g groups
		if inProgress, err = x.Records(ctx, days.from, days.to, *orgID, func(r finance.Record) error {
			k := r.Day
			switch *by {
			case "model":
				k = r.Model
			case "org":
				k = r.OrgID
			}
			if err := g.add(k, usage.TotalsOf(r.Event)); err != nil {
				return fmt.Errorf("sum cost at generation %s: %w", r.GenerationID, err)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := writeFinanceRollup(out, *by, days.from, days.to, g, *asCSV, *f.json); err != nil {
			return err
		}
	}
	if inProgress > 0 {
		fmt.Fprintf(c.stderr, "kilnctl: %d usage items of requests still running skipped\n", inProgress)
	}
	return out.Flush()
}

// recordWriter writes usage records as they are read: CSV rows, a JSON array element by
// element, or text lines (no aligned table: that would hold every row in memory). A write that
// fails stops the read.
type recordWriter struct {
	w     *bufio.Writer
	csv   *csv.Writer
	json  bool
	n     int
	total usage.Totals
}

// recordLine is a line of the text listing, the header's and each record's.
const recordLine = "%-30s  %-30s  %-20s  %-14s  %-20s  %8v  %8v  %10v  %s\n"

func newRecordWriter(w *bufio.Writer, asCSV, asJSON bool) (*recordWriter, error) {
	rw := &recordWriter{w: w, json: asJSON}
	var err error
	switch {
	case asCSV:
		rw.csv = csv.NewWriter(w)
		err = rw.csv.Write(safeCells(eventColumns))
	case asJSON:
		_, err = w.WriteString("[")
	default:
		_, err = fmt.Fprintf(w, recordLine,
			"STARTED", "GENERATION", "ORG", "MODEL", "STATUS", "PROMPT", "CACHED", "COMPLETION", "COST USD")
	}
	return rw, err
}

func (rw *recordWriter) write(r finance.Record) error {
	if err := rw.total.Add(usage.TotalsOf(r.Event)); err != nil {
		return fmt.Errorf("sum cost at generation %s: %w", r.GenerationID, err)
	}
	e := r.Event
	rw.n++
	switch {
	case rw.csv != nil:
		return rw.csv.Write(safeCells(eventRow(e)))
	case rw.json:
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if rw.n > 1 {
			rw.w.WriteByte(',')
		}
		rw.w.WriteString("\n  ")
		_, err = rw.w.Write(b) // a bufio.Writer keeps its first error: this returns the earlier ones too
		return err
	}
	_, err := fmt.Fprintf(rw.w, recordLine,
		exactTime(e.StartedAt), e.GenerationID, oneLine(e.OrgID), oneLine(orNone(e.Model)), e.Status,
		e.PromptTokens, e.CachedTokens, e.CompletionTokens, usd(e.Cost))
	return err
}

func (rw *recordWriter) close() error {
	var err error
	switch {
	case rw.csv != nil:
		rw.csv.Flush()
		return rw.csv.Error()
	case rw.json && rw.n > 0:
		_, err = rw.w.WriteString("\n]\n")
	case rw.json:
		_, err = rw.w.WriteString("]\n")
	default:
		_, err = fmt.Fprintf(rw.w, "%d requests, %s USD\n", rw.total.Requests, usd(rw.total.Cost))
	}
	return err
}

func writeFinanceRollup(w io.Writer, by, from, to string, g groups, asCSV, asJSON bool) error {
	if !asJSON {
		return writeRollup(w, by, g, asCSV)
	}
	type row struct {
		Key string `json:"key"`
		usage.Totals
	}
	rows := make([]row, 0, len(g.of))
	for _, k := range g.keys() {
		rows = append(rows, row{k, *g.of[k]})
	}
	return writeJSON(w, struct {
		From  string       `json:"from"`
		To    string       `json:"to"`
		By    string       `json:"by"`
		Rows  []row        `json:"rows"`
		Total usage.Totals `json:"total"`
	}{from, to, by, rows, g.total})
}

// financeReconcile answers "kilnctl finance reconcile": per organization × UTC day, the ledger's
// debits against the usage records against the aggregates, exit status 3 when anything differs.
func financeReconcile(ctx context.Context, c *cli, f *flags, args []string) error {
	where := f.required("export", "the export's `LOCATION`: s3://BUCKET/PREFIX, or a directory holding a copy of it (required)")
	days := f.period()
	if _, err := f.parse(args); err != nil {
		return err
	}
	x, err := c.openExport(ctx, *where)
	if err != nil {
		return err
	}
	res, err := x.Reconcile(ctx, finance.Options{From: days.from, To: days.to})
	if err != nil {
		return err
	}
	if *f.json {
		if err := writeJSON(c.stdout, res); err != nil {
			return err
		}
	} else if err := writeReconciliation(c.stdout, res); err != nil {
		return err
	}
	if !res.Agrees {
		return &exitCode{code: exitDiffers, msg: fmt.Sprintf("the figures differ: %d difference(s) from %s to %s", res.DifferenceCount, res.From, res.To)}
	}
	return nil
}

func writeReconciliation(w io.Writer, res finance.Result) error {
	amount := func(a *money.Amount) string {
		if a == nil {
			return "-"
		}
		return usd(*a)
	}
	t := newTable(w, "ORG", "DAY", "REQUESTS", "LEDGER USD", "USAGE USD", "AGGREGATES USD", "")
	for _, r := range res.Rows {
		status := "ok"
		if !r.Agrees {
			status = "DIFFERS"
		}
		t.row(r.OrgID, r.Day, strconv.FormatInt(r.Requests, 10), usd(r.Ledger), usd(r.Usage), amount(r.Aggregates), status)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if res.InProgress > 0 {
		fmt.Fprintf(w, "%d usage items of requests still running skipped\n", res.InProgress)
	}
	if res.Agrees {
		_, err := fmt.Fprintf(w, "every figure agrees, %s to %s\n", res.From, res.To)
		return err
	}
	fmt.Fprintf(w, "\n%d difference(s)", res.DifferenceCount)
	if len(res.Differences) < res.DifferenceCount {
		fmt.Fprintf(w, ", the first %d listed", len(res.Differences))
	}
	fmt.Fprintln(w, ":")
	t = newTable(w, "KIND", "ORG", "DAY", "GENERATION", "LEDGER USD", "USAGE USD", "AGGREGATE USD")
	for _, d := range res.Differences {
		t.row(d.Kind, d.OrgID, d.Day, orNone(d.GenerationID), amount(d.Ledger), amount(d.Usage), amount(d.Aggregate))
	}
	return t.flush()
}
