package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neocloud/kiln/pkg/config"
	"github.com/neocloud/kiln/pkg/store"
)

// testEnv is a kilnctl environment over a fresh embedded store.
type testEnv struct {
	t    *testing.T
	vars map[string]string
}

// storeVars, when set, gives new test environments another store's variables instead of a fresh
// embedded store: the DynamoDB tests set it to run these tests against DynamoDB Local.
var storeVars func(t *testing.T) map[string]string

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	if storeVars != nil {
		return &testEnv{t: t, vars: storeVars(t)}
	}
	return &testEnv{t: t, vars: map[string]string{
		"KILN_STORE":    config.StoreSQLite,
		"KILN_DATA_DIR": t.TempDir(),
	}}
}

func (e *testEnv) getenv(name string) string { return e.vars[name] }

// run runs kilnctl with args and returns its exit status and output.
func (e *testEnv) run(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, e.getenv, &out, &errOut)
	return code, out.String(), errOut.String()
}

// ok runs kilnctl and fails the test unless it succeeds.
func (e *testEnv) ok(args ...string) string {
	e.t.Helper()
	code, out, errOut := e.run(args...)
	if code != 0 {
		e.t.Fatalf("kilnctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// json runs kilnctl with --json appended, checks that stdout is exactly one JSON document and
// decodes it into v.
func (e *testEnv) json(v any, args ...string) {
	e.t.Helper()
	out := e.ok(append(args, "--json")...)
	decodeOne(e.t, out, v)
}

func decodeOne(t *testing.T, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %T: %v\n%s", v, err, out)
	}
	if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) {
		t.Fatalf("more than one JSON document (%v):\n%s", err, out)
	}
}

// store opens the environment's store beside kilnctl, as a running gateway would.
func (e *testEnv) store() store.Store {
	e.t.Helper()
	cfg, err := config.Load(e.getenv)
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := openStore(context.Background(), cfg, io.Discard, true)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { st.Close() })
	return st
}

// orgJSON is an organization as kilnctl prints it.
type orgJSON struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Status      string `json:"status"`
	MaxInFlight int    `json:"max_in_flight"`
	Balance     string `json:"balance"`
	Reserved    string `json:"reserved"`
	CreatedAt   string `json:"created_at"`
}

func TestHelpGoesToStdoutAndExitsZero(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"help", []string{"help"}, []string{"kilnctl org create", "kilnctl usage --org", "kilnctl maintenance on", "KILN_DATA_DIR"}},
		{"dash h", []string{"-h"}, []string{"kilnctl credits ledger"}},
		{"group", []string{"org", "-h"}, []string{"kilnctl org set-limit ID N"}},
		{"command", []string{"org", "create", "-h"}, []string{"usage: kilnctl org create", "-max-in-flight"}},
		{"help command", []string{"help", "credits", "adjust"}, []string{"usage: kilnctl credits adjust", "-note"}},
		{"help after args", []string{"usage", "--org", "x", "--help"}, []string{"-by"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := e.run(tc.args...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("help lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestEveryCommandHasItsHelp: each command's -h prints its usage line and its summary as a
// sentence, which the usage text capitalizes.
func TestEveryCommandHasItsHelp(t *testing.T) {
	e := newTestEnv(t)
	for _, cmd := range commands() {
		if cmd.summary == "" {
			t.Errorf("%s: no summary", cmd.name)
			continue
		}
		code, out, errOut := e.run(append(strings.Fields(cmd.name), "-h")...)
		sentence := strings.ToUpper(cmd.summary[:1]) + cmd.summary[1:] + "."
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: kilnctl "+cmd.name) || !strings.Contains(out, "\n"+sentence+"\n") {
			t.Errorf("%s -h: exit %d, stderr %q, stdout:\n%s", cmd.name, code, errOut, out)
		}
	}
}

// snapshot is everything kilnctl can change, to check that a failed command changed nothing.
func snapshot(t *testing.T, st store.Store) string {
	t.Helper()
	ctx := context.Background()
	orgs, err := st.Orgs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]any{"orgs": orgs}
	for _, o := range orgs {
		keys, err := st.Keys(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		ledger, err := st.Ledger(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		all["keys "+o.ID], all["ledger "+o.ID] = keys, ledger
	}
	m, err := st.Maintenance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all["maintenance"] = m
	b, err := json.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBadInputsFailClearlyAndChangeNothing(t *testing.T) {
	e := newTestEnv(t)
	e.ok("org", "create", "--name", "Acme", "--id", "org_acme")
	e.ok("credits", "add", "--org", "org_acme", "--usd", "5")
	st := e.store()
	before := snapshot(t, st)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"no command", nil, 2, "no command"},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown subcommand", []string{"org", "frobnicate"}, 2, `unknown command "org frobnicate"`},
		{"group alone", []string{"credits"}, 2, "no subcommand"},
		{"help on unknown", []string{"help", "nope"}, 2, "unknown command"},
		{"unknown flag", []string{"org", "list", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{"org create without name", []string{"org", "create"}, 2, "--name is required"},
		{"org create limit zero", []string{"org", "create", "--name", "X", "--max-in-flight", "0"}, 2, "--max-in-flight 0"},
		{"org create limit too high", []string{"org", "create", "--name", "X", "--max-in-flight", "10001"}, 2, "want 1..10000"},
		{"org create limit not a number", []string{"org", "create", "--name", "X", "--max-in-flight", "many"}, 2, "invalid value"},
		{"org create bad id", []string{"org", "create", "--name", "X", "--id", "org acme"}, 2, "--id"},
		{"org create taken id", []string{"org", "create", "--name", "X", "--id", "org_acme"}, 1, `organization "org_acme" already exists`},
		{"org show without id", []string{"org", "show"}, 2, "missing ID"},
		{"org show two ids", []string{"org", "show", "org_acme", "org_b"}, 2, `unexpected argument "org_b"`},
		{"org show unknown", []string{"org", "show", "org_nope"}, 1, `organization "org_nope" not found`},
		{"org suspend unknown", []string{"org", "suspend", "org_nope"}, 1, "not found"},
		{"set-limit not a number", []string{"org", "set-limit", "org_acme", "x"}, 2, `limit "x"`},
		{"set-limit zero", []string{"org", "set-limit", "org_acme", "0"}, 2, "want a whole number 1..10000"},
		{"set-limit unknown org", []string{"org", "set-limit", "org_nope", "4"}, 1, "not found"},
		{"key create without org", []string{"key", "create"}, 2, "--org is required"},
		{"key create unknown org", []string{"key", "create", "--org", "org_nope"}, 1, `organization "org_nope" not found`},
		{"key list unknown org", []string{"key", "list", "--org", "org_nope"}, 1, "not found"},
		{"key revoke unknown", []string{"key", "revoke", "kiln-nope1234"}, 1, `key "kiln-nope1234" not found`},
		{"credits add without org", []string{"credits", "add", "--usd", "10"}, 2, "--org is required"},
		{"credits add without usd", []string{"credits", "add", "--org", "org_acme"}, 2, "--usd is required"},
		{"credits add exponent", []string{"credits", "add", "--org", "org_acme", "--usd", "1e3"}, 2, "not a plain decimal"},
		{"credits add float noise", []string{"credits", "add", "--org", "org_acme", "--usd", "0.1234567890123"}, 2, "more than 12 decimal places"},
		{"credits add negative", []string{"credits", "add", "--org", "org_acme", "--usd", "-5"}, 2, "must be positive"},
		{"credits add zero", []string{"credits", "add", "--org", "org_acme", "--usd", "0"}, 2, "must be positive"},
		{"credits add unknown org", []string{"credits", "add", "--org", "org_nope", "--usd", "1"}, 1, `organization "org_nope" not found`},
		{"credits adjust without note", []string{"credits", "adjust", "--org", "org_acme", "--usd", "-1"}, 2, "--note is required"},
		{"credits adjust zero", []string{"credits", "adjust", "--org", "org_acme", "--usd", "0", "--note", "x"}, 2, "must not be zero"},
		{"credits show unknown org", []string{"credits", "show", "--org", "org_nope"}, 1, "not found"},
		{"ledger csv and json", []string{"credits", "ledger", "--org", "org_acme", "--csv", "--json"}, 2, "exclude each other"},
		{"usage without org", []string{"usage", "--from", "2026-11-01", "--to", "2026-11-02"}, 2, "--org is required"},
		{"usage without dates", []string{"usage", "--org", "org_acme"}, 2, "--from and --to are required"},
		{"usage bad day", []string{"usage", "--org", "org_acme", "--from", "Nov 1", "--to", "2026-11-02"}, 2, `--from "Nov 1"`},
		{"usage backwards", []string{"usage", "--org", "org_acme", "--from", "2026-11-02", "--to", "2026-11-01"}, 2, "before --from"},
		{"usage by week", []string{"usage", "--org", "org_acme", "--from", "2026-11-01", "--to", "2026-11-02", "--by", "week"}, 2, `--by "week"`},
		{"usage unknown org", []string{"usage", "--org", "org_nope", "--from", "2026-11-01", "--to", "2026-11-02"}, 1, "not found"},
		{"maintenance on without until", []string{"maintenance", "on"}, 2, "--until is required"},
		{"maintenance on bad time", []string{"maintenance", "on", "--until", "tomorrow"}, 2, "RFC 3339"},
		{"maintenance on in the past", []string{"maintenance", "on", "--until", "2000-01-01T00:00:00Z"}, 2, "not in the future"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := e.run(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.code, errOut)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, errOut)
			}
			if tc.code == 2 && !strings.Contains(errOut, "usage:") {
				t.Errorf("a usage error without the usage:\n%s", errOut)
			}
			if after := snapshot(t, st); after != before {
				t.Errorf("state changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestUnreadableConfigurationIsAnError(t *testing.T) {
	e := newTestEnv(t)
	e.vars["KILN_STORE"] = "postgres"
	code, _, errOut := e.run("org", "list")
	if code != 1 || !strings.Contains(errOut, `KILN_STORE="postgres"`) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// TestMissingDataDirectory: run where no store is (another directory, a mistyped KILN_DATA_DIR),
// a command that reads refuses, naming the directory and the store, instead of creating an empty
// store and listing nothing; creating an organization starts a new store and says so; every
// command that opens a store names it on stderr, so that --json's stdout stays one document.
func TestMissingDataDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "elsewhere", ".kiln")
	e := &testEnv{t: t, vars: map[string]string{"KILN_STORE": config.StoreSQLite, "KILN_DATA_DIR": dir}}
	for _, args := range [][]string{{"org", "list"}, {"usage", "--org", "org_demo", "--from", "2026-12-01", "--to", "2026-12-01"}, {"maintenance", "show"}} {
		code, out, errOut := e.run(args...)
		if code != 1 || out != "" || !strings.Contains(errOut, "no embedded store in "+dir) || !strings.Contains(errOut, "does not exist") {
			t.Errorf("kilnctl %s: exit %d, stdout %q, stderr %q; want exit 1 naming the store and %s", strings.Join(args, " "), code, out, errOut, dir)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("kilnctl %s created %s (%v)", strings.Join(args, " "), dir, err)
		}
	}

	code, out, errOut := e.run("org", "create", "--name", "First", "--json")
	if code != 0 || !strings.Contains(errOut, "kilnctl: store: a new embedded store in "+dir) {
		t.Fatalf("org create: exit %d, stderr %q", code, errOut)
	}
	var created orgJSON
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatalf("org create --json: %v\n%s", err, out)
	}
	code, out, errOut = e.run("org", "list", "--json")
	if code != 0 || errOut != "kilnctl: store: the embedded store in "+dir+"\n" || !strings.Contains(out, created.ID) || !json.Valid([]byte(out)) {
		t.Errorf("org list --json: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
