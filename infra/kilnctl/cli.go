package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store"
	"github.com/neocloud/kiln/pkg/store/dynamo"
	"github.com/neocloud/kiln/pkg/store/sqlite"
)

// cli is one invocation of kilnctl: where it writes, how it reads the environment and the
// clock, and the store, opened only once a command's arguments have been accepted.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	st             store.Store
	mayCreate      bool // the command may be the first write to a new embedded store
}

// run executes one kilnctl command line (without the program name) and returns the exit
// status: 0 on success, 1 when the command failed, 2 when it was used wrongly.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr, getenv: getenv, now: time.Now}
	code := c.run(ctx, args)
	if c.st != nil {
		if err := c.st.Close(); err != nil {
			fmt.Fprintf(stderr, "kilnctl: close store: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

func (c *cli) run(ctx context.Context, args []string) int {
	err := c.dispatch(ctx, args)
	var help *helpRequest
	var usage *usageError
	var exit *exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		fmt.Fprintf(c.stderr, "kilnctl: %s\n", exit.msg)
		return exit.code
	case errors.As(err, &help):
		io.WriteString(c.stdout, help.usage)
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(c.stderr, "kilnctl: %s\n\n%s", usage.msg, usage.usage)
		return 2
	default:
		fmt.Fprintf(c.stderr, "kilnctl: %v\n", err)
		return 1
	}
}

// command is one kilnctl command, such as "org create".
type command struct {
	name    string // the words that select it
	args    string // its arguments, for the usage line
	summary string
	run     func(ctx context.Context, c *cli, f *flags, args []string) error
}

// commands lists every command in the order help shows them. It is a function rather than a
// variable because the help command refers back to it.
func commands() []command {
	return []command{
		{"org create", "--name NAME [--max-in-flight N] [--id ID]", "create an organization", orgCreate},
		{"org list", "", "list organizations", orgList},
		{"org show", "ID", "show an organization with its balance and in-flight requests", orgShow},
		{"org suspend", "ID", "refuse the organization's requests until it is resumed", setStatus(store.OrgSuspended)},
		{"org resume", "ID", "accept the organization's requests again", setStatus(store.OrgActive)},
		{"org set-limit", "ID N", "set the organization's in-flight limit (1..10000)", orgSetLimit},
		{"key create", "--org ID", "create an API key; the key is printed once", keyCreate},
		{"key list", "--org ID", "list an organization's keys (never their secrets)", keyList},
		{"key revoke", "KEY_ID", "revoke a key", keyRevoke},
		{"credits add", "--org ID --usd AMOUNT [--note TEXT]", "top up an organization's credits", addEntry(store.EntryTopUp)},
		{"credits adjust", "--org ID --usd AMOUNT --note TEXT", "correct an organization's credits by a signed amount", addEntry(store.EntryAdjustment)},
		{"credits show", "--org ID", "show an organization's balance, reserved and available credits, and limit", creditsShow},
		{"credits ledger", "--org ID [--csv]", "list an organization's ledger entries", creditsLedger},
		{"usage", "--org ID --from DAY --to DAY [--by day|model] [--csv]", "list or roll up an organization's usage (UTC days, --to inclusive)", usageReport},
		{"maintenance on", "--until TIME", "answer 503 to every request until TIME (RFC 3339)", maintenanceOn},
		{"maintenance off", "", "end the maintenance window", maintenanceOff},
		{"maintenance show", "", "show the maintenance window", maintenanceShow},
		{"finance export", "--bucket B --prefix P [--at TIME]", "export the ledger, usage and aggregates tables to S3 (point in time) and wait", financeExport},
		{"finance report", "--export s3://B/P|DIR --from DAY --to DAY [--by day|model|org] [--org ID] [--csv]", "list or roll up the usage records of an export", financeReport},
		{"finance reconcile", "--export s3://B/P|DIR --from DAY --to DAY", "prove an export's ledger, usage and aggregates agree per organization and day (exit 3 if not)", financeReconcile},
		{"catalog docs", "--lang en|ja|ko [--catalog FILE] [--out FILE]", "render the customers' Models page (Markdown; --json wraps it) from the model catalog", catalogDocs},
		{"dev create-tables", "", "create the missing DynamoDB tables on the local endpoint, with point-in-time recovery", devCreateTables},
	}
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return &usageError{msg: "no command given", usage: overview("")}
	}
	if args[0] == "help" || isHelpFlag(args[0]) {
		return c.help(ctx, args[1:])
	}
	cmds := commands()
	for i := range cmds {
		words := strings.Fields(cmds[i].name)
		if len(args) >= len(words) && slices.Equal(args[:len(words)], words) {
			f := newFlags(&cmds[i])
			return cmds[i].run(ctx, c, f, args[len(words):])
		}
	}
	if group := overview(args[0]); group != "" {
		if len(args) == 1 {
			return &usageError{msg: args[0] + ": no subcommand given", usage: group}
		}
		if isHelpFlag(args[1]) {
			return &helpRequest{usage: group}
		}
		return &usageError{msg: fmt.Sprintf("unknown command %q", args[0]+" "+args[1]), usage: group}
	}
	return &usageError{msg: fmt.Sprintf("unknown command %q", args[0]), usage: overview("")}
}

// help answers "kilnctl help [COMMAND]".
func (c *cli) help(ctx context.Context, topic []string) error {
	if len(topic) == 0 {
		return &helpRequest{usage: overview("")}
	}
	// A command's own -h renders its flags, so help on a command is that.
	err := c.dispatch(ctx, append(slices.Clone(topic), "-h"))
	if _, ok := errors.AsType[*helpRequest](err); ok {
		return err
	}
	return &usageError{msg: fmt.Sprintf("no help for %q: unknown command", strings.Join(topic, " ")), usage: overview("")}
}

func isHelpFlag(s string) bool {
	return s == "-h" || s == "-help" || s == "--help"
}

// overview lists the commands whose first word is group, or all of them when group is "". It
// returns "" when no command starts with group.
func overview(group string) string {
	var b bytes.Buffer
	if group == "" {
		b.WriteString("kilnctl administers a Kiln gateway: organizations, API keys, credits, usage, the\n" +
			"maintenance window, and finance's exports, reports and reconciliation.\n\n")
	}
	b.WriteString("usage:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	n := 0
	for _, cmd := range commands() {
		if group != "" && strings.Fields(cmd.name)[0] != group {
			continue
		}
		n++
		fmt.Fprintf(tw, "  kilnctl %s\t%s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.summary)
	}
	tw.Flush()
	if n == 0 {
		return ""
	}
	b.WriteString("\nEvery command takes --json to print one JSON document instead of text, and -h for its flags.\n")
	if group == "" {
		b.WriteString("Flags may come before or after arguments. Money is exact decimal USD (\"10\", \"0.000001\").\n\n" +
			"environment:\n" +
			"  KILN_STORE      sqlite (default) or dynamodb\n" +
			"  KILN_DATA_DIR   embedded store directory (default ./.kiln)\n" +
			"  KILN_TABLE_PREFIX, KILN_DYNAMODB_ENDPOINT, AWS_REGION   for the DynamoDB store\n" +
			"  AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL_S3   the SDK's endpoint overrides\n\n" +
			"exit status: 0 success, 1 the command failed, 2 the command was used wrongly,\n" +
			"3 finance reconcile found figures that differ.\n")
	}
	return b.String()
}

// helpRequest is returned when -h or help asked for a usage text; it goes to stdout.
type helpRequest struct{ usage string }

func (h *helpRequest) Error() string { return "help requested" }

// usageError is a command used wrongly: the message and the command's usage go to stderr and
// kilnctl exits with status 2, having changed nothing.
type usageError struct{ msg, usage string }

func (u *usageError) Error() string { return u.msg }

// flags is a command's flag set with the flags every command has.
type flags struct {
	*flag.FlagSet
	cmd    *command
	json   *bool
	csv    *bool    // --csv, when the command has it: parse refuses it with --json
	days   *period  // --from and --to, when the command has them: parse reads them
	needed []string // the flags parse requires, in the order they were declared
}

func newFlags(cmd *command) *flags {
	fs := flag.NewFlagSet("kilnctl "+cmd.name, flag.ContinueOnError)
	// Parse returns the same message it would print; run prints it with the usage.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	f := &flags{FlagSet: fs, cmd: cmd}
	f.json = fs.Bool("json", false, "print one JSON document instead of text")
	return f
}

// required declares a string flag that parse refuses to leave empty.
func (f *flags) required(name, usage string) *string {
	f.needed = append(f.needed, name)
	return f.String(name, "", usage)
}

// org declares --org, the organization a command works on.
func (f *flags) org() *string { return f.required("org", "the organization's `ID` (required)") }

// csvFlag declares --csv.
func (f *flags) csvFlag(usage string) *bool {
	f.csv = f.Bool("csv", false, usage)
	return f.csv
}

// period is the UTC days a command covers: --from to --to, both included.
type period struct {
	from, to    string
	first, last time.Time
}

// period declares --from and --to.
func (f *flags) period() *period {
	f.days = &period{}
	f.StringVar(&f.days.from, "from", "", "the first UTC `DAY`, such as 2026-11-01 (required)")
	f.StringVar(&f.days.to, "to", "", "the last UTC `DAY`, included (required)")
	return f.days
}

// parse reads flags and exactly the named positional arguments, in any order: the flag
// package stops at the first non-flag, so parsing resumes after each positional argument.
// Then every required flag must have a value, --csv excludes --json, and --from and --to must
// be days in that order.
func (f *flags) parse(args []string, positional ...string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &helpRequest{usage: f.usage()}
			}
			return nil, f.usageErr("%v", err)
		}
		rest := f.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	switch {
	case len(pos) < len(positional):
		return nil, f.usageErr("missing %s", strings.Join(positional[len(pos):], " "))
	case len(pos) > len(positional):
		return nil, f.usageErr("unexpected argument %q", pos[len(positional)])
	}
	for _, name := range f.needed {
		if f.Lookup(name).Value.String() == "" {
			return nil, f.usageErr("--%s is required", name)
		}
	}
	if f.csv != nil && *f.csv && *f.json {
		return nil, f.usageErr("--csv and --json exclude each other")
	}
	if p := f.days; p != nil {
		if p.from == "" || p.to == "" {
			return nil, f.usageErr("--from and --to are required")
		}
		var errFrom, errTo error
		p.first, errFrom = time.Parse(time.DateOnly, p.from)
		p.last, errTo = time.Parse(time.DateOnly, p.to)
		switch {
		case errFrom != nil:
			return nil, f.usageErr("--from %q: want a day such as 2026-11-01", p.from)
		case errTo != nil:
			return nil, f.usageErr("--to %q: want a day such as 2026-11-30", p.to)
		case p.last.Before(p.first):
			return nil, f.usageErr("--to %s is before --from %s", p.to, p.from)
		}
	}
	return pos, nil
}

func (f *flags) usageErr(format string, a ...any) error {
	return &usageError{msg: f.cmd.name + ": " + fmt.Sprintf(format, a...), usage: f.usage()}
}

func (f *flags) usage() string {
	var b bytes.Buffer
	summary := f.cmd.summary // never empty: TestEveryCommandHasItsHelp
	fmt.Fprintf(&b, "usage: kilnctl %s [--json]\n\n%s.\n\nflags:\n", strings.TrimSpace(f.cmd.name+" "+f.cmd.args), strings.ToUpper(summary[:1])+summary[1:])
	f.SetOutput(&b)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
	return b.String()
}

// store opens the configured store on first use, and says on stderr which one it reads: run
// from another directory, kilnctl would otherwise read a store the gateway does not use. An
// embedded store whose directory does not exist is refused (opening it would create an empty
// one) unless the command may start a new store (c.mayCreate: org create).
func (c *cli) store(ctx context.Context) (store.Store, error) {
	if c.st != nil {
		return c.st, nil
	}
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, cfg, c.stderr, c.mayCreate)
	if err != nil {
		return nil, err
	}
	c.st = st
	return st, nil
}

// config reads kilnctl's configuration from its environment.
func (c *cli) config() (config.Config, error) {
	cfg, err := config.Load(c.getenv)
	if err != nil {
		return cfg, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// openStore opens the store cfg names, after writing which one it is to w.
func openStore(ctx context.Context, cfg config.Config, w io.Writer, mayCreate bool) (store.Store, error) {
	if cfg.Store == config.StoreDynamoDB {
		where := "in AWS"
		if cfg.DynamoDBEndpoint != "" {
			where = "on " + cfg.DynamoDBEndpoint
		}
		fmt.Fprintf(w, "kilnctl: store: DynamoDB tables %s* %s\n", cfg.TablePrefix, where)
		return dynamo.Open(ctx, dynamo.Config{TablePrefix: cfg.TablePrefix, Endpoint: cfg.DynamoDBEndpoint, Region: cfg.Region})
	}
	dir, _ := filepath.Abs(cfg.DataDir) // fails only without a working directory: KILN_DATA_DIR still names it
	what := "the embedded store"
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if !mayCreate {
			return nil, fmt.Errorf("no embedded store in %s (KILN_DATA_DIR=%s): the directory does not exist. "+
				"Run kilnctl where the gateway runs (make run keeps its store in .kiln beside the Makefile), "+
				"or set KILN_DATA_DIR to the gateway's data directory (KILN_STORE=dynamodb for DynamoDB)", dir, cfg.DataDir)
		}
		what = "a new embedded store"
	}
	fmt.Fprintf(w, "kilnctl: store: %s in %s\n", what, dir)
	return sqlite.Open(cfg.DataDir, sqlite.Options{})
}

// org reads one organization, naming it plainly when it does not exist.
func (c *cli) org(ctx context.Context, st store.Store, orgID string) (store.Org, error) {
	o, err := st.Org(ctx, orgID)
	if errors.Is(err, store.ErrNotFound) {
		return o, fmt.Errorf("organization %q not found", orgID)
	}
	if err != nil {
		return o, fmt.Errorf("read organization %s: %w", orgID, err)
	}
	return o, nil
}

// storeAndOrg opens the store and reads the organization a command names.
func (c *cli) storeAndOrg(ctx context.Context, orgID string) (store.Store, store.Org, error) {
	st, err := c.store(ctx)
	if err != nil {
		return nil, store.Org{}, err
	}
	o, err := c.org(ctx, st, orgID)
	return st, o, err
}

// printf writes to stdout.
func (c *cli) printf(format string, a ...any) error {
	_, err := fmt.Fprintf(c.stdout, format, a...)
	return err
}

// clock returns the current time in UTC; every stored and printed time is UTC.
func (c *cli) clock() time.Time { return c.now().UTC() }
