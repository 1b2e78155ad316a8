package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// entryResult is what credits add and adjust print: the new entry and the balance after it.
type entryResult struct {
	Entry   store.LedgerEntry `json:"entry"`
	Balance money.Amount      `json:"balance"`
}

// addEntry is credits add (a top-up) and credits adjust (an adjustment).
func addEntry(kind store.EntryKind) func(context.Context, *cli, *flags, []string) error {
	return func(ctx context.Context, c *cli, f *flags, args []string) error {
		orgID := f.org()
		amountHelp, noteHelp := "the `AMOUNT` in USD, a positive plain decimal such as 10.00 (required)", "a `NOTE` for the ledger"
		if kind == store.EntryAdjustment {
			amountHelp, noteHelp = "the signed `AMOUNT` in USD, such as -1.50 (required)", "why the balance is corrected, as a `NOTE` (required)"
		}
		amount := f.required("usd", amountHelp)
		note := f.String("note", "", noteHelp)
		if _, err := f.parse(args); err != nil {
			return err
		}
		a, err := money.Parse(*amount)
		if err != nil {
			return f.usageErr("--usd: %v", err)
		}
		prefix := "top_"
		switch kind {
		case store.EntryTopUp:
			if a <= 0 {
				return f.usageErr("--usd %s: a top-up must be positive; use credits adjust for corrections", *amount)
			}
		case store.EntryAdjustment:
			prefix = "adj_"
			if a == 0 {
				return f.usageErr("--usd %s: an adjustment must not be zero", *amount)
			}
			if strings.TrimSpace(*note) == "" {
				return f.usageErr("--note is required: say why the balance is corrected")
			}
		}
		st, _, err := c.storeAndOrg(ctx, *orgID)
		if err != nil {
			return err
		}
		e := store.LedgerEntry{
			ID:     newID(prefix),
			OrgID:  *orgID,
			Kind:   kind,
			Amount: a,
			Note:   strings.TrimSpace(*note),
			At:     c.clock(),
		}
		if err := st.AddEntry(ctx, e); errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("organization %q not found", *orgID)
		} else if err != nil {
			return fmt.Errorf("add %s to %s: %w", kind, *orgID, err)
		}
		o, err := c.org(ctx, st, *orgID)
		if err != nil {
			return err
		}
		if *f.json {
			return writeJSON(c.stdout, entryResult{Entry: e, Balance: o.Balance})
		}
		verb := "added"
		if kind == store.EntryAdjustment {
			verb = "adjusted by"
		}
		return c.printf("%s %s USD (entry %s); balance of %s is %s USD\n", verb, usd(a), e.ID, o.ID, usd(o.Balance))
	}
}
func creditsShow(ctx context.Context, c *cli, f *flags, args []string) error {
	orgID := f.org()
	if _, err := f.parse(args); err != nil {
		return err
	}
	_, o, err := c.storeAndOrg(ctx, *orgID)
	if err != nil {
		return err
	}
	if *f.json {
		return writeJSON(c.stdout, struct {
			OrgID       string          `json:"org_id"`
			Status      store.OrgStatus `json:"status"`
			Balance     money.Amount    `json:"balance"`
			Reserved    money.Amount    `json:"reserved"`
			Available   money.Amount    `json:"available"`
			MaxInFlight int             `json:"max_in_flight"`
		}{o.ID, o.Status, o.Balance, o.Reserved, o.Available(), o.MaxInFlight})
	}
	t := newTable(c.stdout, "organization", o.ID)
	t.row("status", string(o.Status))
	t.row("balance", usd(o.Balance)+" USD")
	t.row("reserved", usd(o.Reserved)+" USD (held by requests in flight)")
	t.row("available", usd(o.Available())+" USD")
	t.row("max in-flight", fmt.Sprint(o.MaxInFlight))
	return t.flush()
}

func creditsLedger(ctx context.Context, c *cli, f *flags, args []string) error {
	orgID := f.org()
	asCSV := f.csvFlag("print CSV: id,time,kind,amount,note")
	if _, err := f.parse(args); err != nil {
		return err
	}
	st, _, err := c.storeAndOrg(ctx, *orgID)
	if err != nil {
		return err
	}
	entries, err := st.Ledger(ctx, *orgID)
	if err != nil {
		return fmt.Errorf("ledger of %s: %w", *orgID, err)
	}
	slices.SortStableFunc(entries, func(a, b store.LedgerEntry) int { return a.At.Compare(b.At) })
	for i := range entries {
		entries[i].At = entries[i].At.UTC()
	}
	switch {
	case *f.json:
		if entries == nil {
			entries = []store.LedgerEntry{}
		}
		return writeJSON(c.stdout, entries)
	case *asCSV:
		rows := make([][]string, 0, len(entries))
		for _, e := range entries {
			rows = append(rows, []string{e.ID, exactTime(e.At), string(e.Kind), e.Amount.String(), e.Note})
		}
		return writeCSV(c.stdout, []string{"id", "time", "kind", "amount", "note"}, rows)
	}
	t := newTable(c.stdout, "TIME", "ID", "KIND", "AMOUNT USD", "NOTE")
	for _, e := range entries {
		t.row(shortTime(e.At), e.ID, string(e.Kind), usd(e.Amount), e.Note)
	}
	return t.flush()
}
