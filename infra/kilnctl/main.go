// Command kilnctl is the operators' command-line program of the Kiln gateway. It works on the
// store the environment names (KILN_STORE: the embedded SQLite store in KILN_DATA_DIR, or
// DynamoDB), the same store the gateway uses.
//
// Usage:
//
//	kilnctl org create --name NAME [--max-in-flight N] [--id ID]
//	kilnctl org list
//	kilnctl org show ID                      balance, limit and requests in flight
//	kilnctl org suspend ID | org resume ID
//	kilnctl org set-limit ID N               in-flight limit, 1..10000
//	kilnctl key create --org ID              prints the key once; it cannot be shown again
//	kilnctl key list --org ID                ids and dates, never secrets
//	kilnctl key revoke KEY_ID
//	kilnctl credits add --org ID --usd 10.00 [--note TEXT]
//	kilnctl credits adjust --org ID --usd -1.50 --note TEXT
//	kilnctl credits show --org ID
//	kilnctl credits ledger --org ID [--csv]
//	kilnctl usage --org ID --from 2026-11-01 --to 2026-11-30 [--by day|model] [--csv]
//	kilnctl maintenance on --until 2026-12-01T06:00:00Z
//	kilnctl maintenance off | maintenance show
//	kilnctl finance export --bucket B --prefix P [--at TIME] [--poll 10s]
//	kilnctl finance report --export s3://B/P|DIR --from DAY --to DAY [--by day|model|org] [--org ID] [--csv]
//	kilnctl finance reconcile --export s3://B/P|DIR --from DAY --to DAY
//	kilnctl catalog docs --lang en|ja|ko [--catalog FILE] [--out FILE]
//	                                         the customers' Models page, from the catalog
//	kilnctl dev create-tables                creates missing DynamoDB tables on KILN_DYNAMODB_ENDPOINT
//	kilnctl help [COMMAND]
//
// Every command takes --json and then prints one JSON document on stdout, and -h for its
// flags. Flags may come before or after positional arguments. Amounts are exact decimal USD
// ("10", "10.00", "0.000001"; exponents such as "1e3" are refused) and are printed as decimal
// strings, never floats. Top-ups must be positive; corrections of either sign go through
// credits adjust with a note. usage takes UTC days, --to included; without --by it lists
// events, with --by it sums requests, tokens and cost per day or per model. Times are UTC;
// CSV times are RFC 3339 with nanoseconds.
//
// Exit status: 0 on success; 1 when the command failed (the message is on stderr); 2 when it
// was used wrongly (the message and the command's usage are on stderr); 3 when finance
// reconcile found figures that differ (the differences are on stdout). A failed or wrongly
// used command changes nothing.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
