package main

import (
	"context"
	"fmt"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// maintenanceView is what the maintenance commands print.
type maintenanceView struct {
	On     bool       `json:"on"`
	Until  *time.Time `json:"until,omitempty"`
	Active bool       `json:"active"` // on, and until is still ahead
}

func viewMaintenance(m store.Maintenance, now time.Time) maintenanceView {
	v := maintenanceView{On: m.On, Active: m.Active(now)}
	if m.On {
		v.Until = new(m.Until.UTC())
	}
	return v
}

func maintenanceOn(ctx context.Context, c *cli, f *flags, args []string) error {
	untilArg := f.required("until", "answer 503 until this `TIME`, RFC 3339 such as 2026-12-01T06:00:00Z (required)")
	if _, err := f.parse(args); err != nil {
		return err
	}
	until, err := time.Parse(time.RFC3339Nano, *untilArg)
	if err != nil {
		return f.usageErr("--until %q: want an RFC 3339 time such as 2026-12-01T06:00:00Z", *untilArg)
	}
	now := c.clock()
	if !until.After(now) {
		return f.usageErr("--until %s is not in the future", *untilArg)
	}
	return setMaintenance(ctx, c, f, store.Maintenance{On: true, Until: until.UTC()}, now)
}

func maintenanceOff(ctx context.Context, c *cli, f *flags, args []string) error {
	if _, err := f.parse(args); err != nil {
		return err
	}
	return setMaintenance(ctx, c, f, store.Maintenance{}, c.clock())
}

func setMaintenance(ctx context.Context, c *cli, f *flags, m store.Maintenance, now time.Time) error {
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	if err := st.SetMaintenance(ctx, m); err != nil {
		return fmt.Errorf("set maintenance: %w", err)
	}
	return c.printMaintenance(f, m, now)
}

func maintenanceShow(ctx context.Context, c *cli, f *flags, args []string) error {
	if _, err := f.parse(args); err != nil {
		return err
	}
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	m, err := st.Maintenance(ctx)
	if err != nil {
		return fmt.Errorf("read maintenance: %w", err)
	}
	return c.printMaintenance(f, m, c.clock())
}

func (c *cli) printMaintenance(f *flags, m store.Maintenance, now time.Time) error {
	v := viewMaintenance(m, now)
	if *f.json {
		return writeJSON(c.stdout, v)
	}
	switch {
	case v.Active:
		return c.printf("maintenance on until %s: the gateway answers 503\n", v.Until.Format(time.RFC3339))
	case v.On:
		return c.printf("maintenance window ended at %s: the gateway serves requests\n", v.Until.Format(time.RFC3339))
	}
	return c.printf("maintenance off: the gateway serves requests\n")
}
