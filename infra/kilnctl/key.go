package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/neocloud/kiln/pkg/apikey"
	"github.com/neocloud/kiln/pkg/store"
)

const onceWarning = "This key is shown only once and cannot be retrieved again: store it now."

// createdKey is what key create prints; the only output of kilnctl that holds a secret.
type createdKey struct {
	Key   string `json:"key"`
	ID    string `json:"id"`
	OrgID string `json:"org_id"`
}

func keyCreate(ctx context.Context, c *cli, f *flags, args []string) error {
	orgID := f.org()
	if _, err := f.parse(args); err != nil {
		return err
	}
	st, o, err := c.storeAndOrg(ctx, *orgID)
	if err != nil {
		return err
	}
	if o.Status == store.OrgSuspended {
		fmt.Fprintf(c.stderr, "kilnctl: warning: organization %s is suspended; the key is refused until it is resumed\n", o.ID)
	}
	var out createdKey
	// The ID is the key's first eight characters, so two keys may share one, rarely; a new
	// key then fixes it.
	for attempt := 0; ; attempt++ {
		key, id, hash, err := apikey.New()
		if err != nil {
			return fmt.Errorf("generate key: %w", err)
		}
		err = st.CreateKey(ctx, store.Key{ID: id, OrgID: o.ID, Hash: hash, CreatedAt: c.clock()})
		if errors.Is(err, store.ErrExists) && attempt < 3 {
			continue
		}
		if err != nil {
			return fmt.Errorf("create key for %s: %w", o.ID, err)
		}
		out = createdKey{Key: key, ID: id, OrgID: o.ID}
		break
	}
	if *f.json {
		fmt.Fprintln(c.stderr, "kilnctl: "+onceWarning)
		return writeJSON(c.stdout, out)
	}
	return c.printf("API key %s for organization %s:\n\n    %s\n\n%s\n", out.ID, out.OrgID, out.Key, onceWarning)
}

// keyView is a key as listed: never its hash.
type keyView struct {
	ID        string     `json:"id"`
	OrgID     string     `json:"org_id"`
	CreatedAt time.Time  `json:"created_at"`
	Revoked   bool       `json:"revoked"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

func keyList(ctx context.Context, c *cli, f *flags, args []string) error {
	orgID := f.org()
	if _, err := f.parse(args); err != nil {
		return err
	}
	st, _, err := c.storeAndOrg(ctx, *orgID)
	if err != nil {
		return err
	}
	keys, err := st.Keys(ctx, *orgID)
	if err != nil {
		return fmt.Errorf("list keys of %s: %w", *orgID, err)
	}
	slices.SortStableFunc(keys, func(a, b store.Key) int { return a.CreatedAt.Compare(b.CreatedAt) })
	views := make([]keyView, 0, len(keys))
	for _, k := range keys {
		v := keyView{ID: k.ID, OrgID: k.OrgID, CreatedAt: k.CreatedAt.UTC(), Revoked: k.RevokedAt != nil}
		if k.RevokedAt != nil {
			v.RevokedAt = new(k.RevokedAt.UTC())
		}
		views = append(views, v)
	}
	if *f.json {
		return writeJSON(c.stdout, views)
	}
	t := newTable(c.stdout, "ID", "CREATED", "REVOKED")
	for _, v := range views {
		revoked := "-"
		if v.RevokedAt != nil {
			revoked = shortTime(*v.RevokedAt)
		}
		t.row(v.ID, shortTime(v.CreatedAt), revoked)
	}
	return t.flush()
}

func keyRevoke(ctx context.Context, c *cli, f *flags, args []string) error {
	pos, err := f.parse(args, "KEY_ID")
	if err != nil {
		return err
	}
	id := pos[0]
	if apikey.Valid(id) {
		// Someone pasted the whole key; its ID is its prefix. Never echo the rest.
		id = apikey.ID(id)
	}
	st, err := c.store(ctx)
	if err != nil {
		return err
	}
	// Revoking a revoked key succeeds and keeps the time it stopped working (the store contract),
	// so a second revoke reads like the first.
	switch err := st.RevokeKey(ctx, id, c.clock()); {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("key %q not found", id)
	case err != nil:
		return fmt.Errorf("revoke key %s: %w", id, err)
	}
	if *f.json {
		return writeJSON(c.stdout, struct {
			ID      string `json:"id"`
			Revoked bool   `json:"revoked"`
		}{id, true})
	}
	return c.printf("revoked key %s\n", id)
}
