package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// maxLimit is the highest in-flight limit kilnctl sets.
const maxLimit = 10000

func orgCreate(ctx context.Context, c *cli, f *flags, args []string) error {
	name := f.String("name", "", "the organization's `name` (required)")
	limit := f.Int("max-in-flight", store.DefaultMaxInFlight, "at most `N` concurrent requests, 1..10000")
	id := f.String("id", "", "the organization's `ID` (default: org_ and 20 random characters)")
	if _, err := f.parse(args); err != nil {
		return err
	}
	if strings.TrimSpace(*name) == "" {
		return f.usageErr("--name is required")
	}
	if *limit < 1 || *limit > maxLimit {
		return f.usageErr("--max-in-flight %d: want 1..%d", *limit, maxLimit)
	}
	if *id == "" {
		*id = newID("org_")
	} else if !orgIDPattern.MatchString(*id) {
		return f.usageErr("--id %q: want 1 to 64 letters, digits, '_', '-' or '.'", *id)
	}
	c.mayCreate = true // a first organization is how an operator starts a store without the gateway
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	err = st.CreateOrg(ctx, store.Org{
		ID:          *id,
		Name:        strings.TrimSpace(*name),
		Status:      store.OrgActive,
		MaxInFlight: *limit,
		CreatedAt:   c.clock(),
	})
	if errors.Is(err, store.ErrExists) {
		return fmt.Errorf("organization %q already exists", *id)
	}
	if err != nil {
		return fmt.Errorf("create organization %s: %w", *id, err)
	}
	o, err := c.org(ctx, st, *id)
	if err != nil {
		return err
	}
	if *f.json {
		return writeJSON(c.stdout, utcOrg(o))
	}
	return c.printf("created organization %s (%q, max in-flight %d)\n", o.ID, o.Name, o.MaxInFlight)
}

// orgIDPattern is what --id accepts.
var orgIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func orgList(ctx context.Context, c *cli, f *flags, args []string) error {
	if _, err := f.parse(args); err != nil {
		return err
	}
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	orgs, err := st.Orgs(ctx)
	if err != nil {
		return fmt.Errorf("list organizations: %w", err)
	}
	slices.SortStableFunc(orgs, func(a, b store.Org) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	if *f.json {
		out := make([]store.Org, 0, len(orgs))
		for _, o := range orgs {
			out = append(out, utcOrg(o))
		}
		return writeJSON(c.stdout, out)
	}
	t := newTable(c.stdout, "ID", "NAME", "STATUS", "MAX IN-FLIGHT", "BALANCE USD", "CREATED")
	for _, o := range orgs {
		t.row(o.ID, o.Name, string(o.Status), strconv.Itoa(o.MaxInFlight), usd(o.Balance), shortTime(o.CreatedAt))
	}
	return t.flush()
}

// orgDetail is what org show prints: the organization and its requests in flight.
type orgDetail struct {
	store.Org
	InFlight int         `json:"in_flight"`
	Leases   []leaseView `json:"leases"`
}

type leaseView struct {
	HolderID string    `json:"holder_id"`
	Expires  time.Time `json:"expires"`
}

func orgShow(ctx context.Context, c *cli, f *flags, args []string) error {
	pos, err := f.parse(args, "ID")
	if err != nil {
		return err
	}
	st, o, err := c.storeAndOrg(ctx, pos[0])
	if err != nil {
		return err
	}
	leases, err := st.InFlight(ctx, o.ID, c.clock())
	if err != nil {
		return fmt.Errorf("in-flight requests of %s: %w", o.ID, err)
	}
	d := orgDetail{Org: utcOrg(o), InFlight: len(leases), Leases: []leaseView{}}
	for _, l := range leases {
		d.Leases = append(d.Leases, leaseView{HolderID: l.HolderID, Expires: l.Expires.UTC()})
	}
	if *f.json {
		return writeJSON(c.stdout, d)
	}
	t := newTable(c.stdout, "id", o.ID)
	t.row("name", o.Name)
	t.row("status", string(o.Status))
	t.row("balance", usd(o.Balance)+" USD")
	t.row("in flight", fmt.Sprintf("%d of %d", len(leases), o.MaxInFlight))
	t.row("created", shortTime(o.CreatedAt))
	for _, l := range d.Leases {
		t.row("  holder", l.HolderID+" until "+exactTime(l.Expires))
	}
	return t.flush()
}

// setStatus is org suspend (status suspended) and org resume (active).
func setStatus(status store.OrgStatus) func(context.Context, *cli, *flags, []string) error {
	return func(ctx context.Context, c *cli, f *flags, args []string) error {
		pos, err := f.parse(args, "ID")
		if err != nil {
			return err
		}
		return updateOrg(ctx, c, f, pos[0], func(st store.Store, id string) error {
			return st.SetOrgStatus(ctx, id, status)
		}, func(o store.Org) string {
			return fmt.Sprintf("organization %s is %s\n", o.ID, o.Status)
		})
	}
}

func orgSetLimit(ctx context.Context, c *cli, f *flags, args []string) error {
	pos, err := f.parse(args, "ID", "N")
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(pos[1])
	if err != nil || n < 1 || n > maxLimit {
		return f.usageErr("limit %q: want a whole number 1..%d", pos[1], maxLimit)
	}
	return updateOrg(ctx, c, f, pos[0], func(st store.Store, id string) error {
		return st.SetMaxInFlight(ctx, id, n)
	}, func(o store.Org) string {
		return fmt.Sprintf("organization %s may have %d requests in flight\n", o.ID, o.MaxInFlight)
	})
}

// updateOrg applies change to an existing organization and prints it as it is afterwards.
func updateOrg(ctx context.Context, c *cli, f *flags, id string, change func(store.Store, string) error, describe func(store.Org) string) error {
	st, _, err := c.storeAndOrg(ctx, id)
	if err != nil {
		return err
	}
	if err := change(st, id); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("organization %q not found", id)
	} else if err != nil {
		return fmt.Errorf("%s %s: %w", f.cmd.name, id, err)
	}
	o, err := c.org(ctx, st, id)
	if err != nil {
		return err
	}
	if *f.json {
		return writeJSON(c.stdout, utcOrg(o))
	}
	return c.printf("%s", describe(o))
}

func utcOrg(o store.Org) store.Org {
	o.CreatedAt = o.CreatedAt.UTC()
	return o
}
