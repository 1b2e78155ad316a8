package dynamo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// CreateOrg creates an organization with a zero balance — credits arrive only through the
// ledger — and its empty lease map, in one conditional PutItem. A zero MaxInFlight means
// store.DefaultMaxInFlight and an empty Status means active. ErrExists when the ID is taken.
func (s *Store) CreateOrg(ctx context.Context, org store.Org) error {
	return store.Wrapf(s.createOrg(ctx, org), "create org %s", org.ID)
}

func (s *Store) createOrg(ctx context.Context, org store.Org) error {
	org, created, err := store.NewOrg(org)
	if err != nil {
		return err
	}
	orgItem := orgKey(org.ID)
	orgItem["id"] = ddbitem.S(org.ID)
	orgItem["name"] = ddbitem.S(org.Name)
	orgItem["status"] = ddbitem.S(string(org.Status))
	orgItem["max_in_flight"] = ddbitem.N(int64(org.MaxInFlight))
	orgItem["balance"] = ddbitem.N(0)
	if created != nil {
		orgItem["created_at"] = ddbitem.N(*created)
	}
	orgItem["available"] = ddbitem.N(0)
	orgItem["leases"] = emptyMap()
	err = write(ctx, func() error {
		_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &s.tables.Orgs, Item: orgItem, ConditionExpression: aws.String("attribute_not_exists(pk)")})
		return err
	})
	if failed, _ := conditionFailed(err); failed {
		return store.ErrExists
	}
	return err
}

func decodeOrg(it item) (store.Org, error) {
	d := ddbitem.NewReader(it)
	o := store.Org{
		ID:          d.Str("id"),
		Name:        d.Str("name"),
		Status:      store.OrgStatus(d.Str("status")),
		MaxInFlight: int(d.Num("max_in_flight")),
		Balance:     money.Amount(d.Num("balance")),
		CreatedAt:   optTime(d, "created_at"),
	}
	o.Reserved = o.Balance - money.Amount(d.Num("available"))
	return o, d.Err()
}

// Org returns one organization with its current balance, from a strongly consistent read.
func (s *Store) Org(ctx context.Context, orgID string) (store.Org, error) {
	o, err := s.org(ctx, orgID)
	return o, store.Wrapf(err, "org %s", orgID)
}

func (s *Store) org(ctx context.Context, orgID string) (store.Org, error) {
	it, err := s.get(ctx, &s.tables.Orgs, orgKey(orgID))
	if err != nil {
		return store.Org{}, err
	}
	return decodeOrg(it)
}

// Orgs lists every organization, by ID. It scans the orgs table, which is fine for operators'
// tooling and never used on the request path.
func (s *Store) Orgs(ctx context.Context) ([]store.Org, error) {
	var orgs []store.Org
	err := s.scanOrgs(ctx, nil, func(it item) error {
		o, err := decodeOrg(it)
		orgs = append(orgs, o)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("orgs: %w", err)
	}
	slices.SortFunc(orgs, func(a, b store.Org) int { return strings.Compare(a.ID, b.ID) })
	return orgs, nil
}

// scanOrgs hands fn every organization item, strongly consistent, with only the attributes
// projection names when it is not nil.
func (s *Store) scanOrgs(ctx context.Context, projection *string, fn func(item) error) error {
	p := dynamodb.NewScanPaginator(s.db, &dynamodb.ScanInput{
		TableName:                 &s.tables.Orgs,
		FilterExpression:          aws.String("sk = :org"),
		ProjectionExpression:      projection,
		ExpressionAttributeValues: item{":org": ddbitem.S(skOrg)},
		ConsistentRead:            aws.Bool(true),
	})
	return eachItem(ctx, p, func(page *dynamodb.ScanOutput) []item { return page.Items }, fn)
}

// pager is one of the SDK's paginators (dynamodb.NewQueryPaginator, NewScanPaginator), whose
// pages are O.
type pager[O any] interface {
	HasMorePages() bool
	NextPage(ctx context.Context, optFns ...func(*dynamodb.Options)) (O, error)
}

// eachItem hands fn the items, which items picks from each page, of every page p reads.
func eachItem[O any](ctx context.Context, p pager[O], items func(O) []item, fn func(item) error) error {
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, it := range items(page) {
			if err := fn(it); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetOrgStatus suspends or resumes an organization.
func (s *Store) SetOrgStatus(ctx context.Context, orgID string, status store.OrgStatus) error {
	if err := store.CheckOrg(status, 1); err != nil {
		return fmt.Errorf("set status of %s: %w", orgID, err)
	}
	err := s.updateOrg(ctx, orgID, "SET #status = :status", names("#status", "status"), item{":status": ddbitem.S(string(status))})
	return store.Wrapf(err, "set status of %s", orgID)
}

// SetMaxInFlight sets an organization's in-flight limit on its org item, where admission compares
// it with the number of leases. Holders above a lowered limit keep their leases until they
// release them.
func (s *Store) SetMaxInFlight(ctx context.Context, orgID string, n int) error {
	if err := store.CheckOrg(store.OrgActive, n); err != nil {
		return fmt.Errorf("set limit of %s: %w", orgID, err)
	}
	err := s.updateOrg(ctx, orgID, "SET max_in_flight = :n", nil, item{":n": ddbitem.N(int64(n))})
	return store.Wrapf(err, "set limit of %s", orgID)
}

// updateOrg applies an update expression to an existing organization's item; store.ErrNotFound
// when there is none.
func (s *Store) updateOrg(ctx context.Context, orgID, expr string, names map[string]string, values item) error {
	err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.tables.Orgs,
		Key:                       orgKey(orgID),
		UpdateExpression:          aws.String(expr),
		ConditionExpression:       aws.String("attribute_exists(pk)"),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	})
	if failed, _ := conditionFailed(err); failed {
		return store.ErrNotFound
	}
	return err
}

// Maintenance returns the maintenance window; off when none was ever set.
func (s *Store) Maintenance(ctx context.Context) (store.Maintenance, error) {
	it, err := s.get(ctx, &s.tables.Orgs, keyOf("pk", pkSettings, "sk", skMaintenance))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Maintenance{}, nil
	case err != nil:
		return store.Maintenance{}, fmt.Errorf("maintenance: %w", err)
	}
	d := ddbitem.NewReader(it)
	m := store.Maintenance{On: d.Bool("on"), Until: optTime(d, "until")}
	if err := d.Err(); err != nil {
		return store.Maintenance{}, fmt.Errorf("maintenance: %w", err)
	}
	return m, nil
}

// SetMaintenance replaces the maintenance window.
func (s *Store) SetMaintenance(ctx context.Context, m store.Maintenance) error {
	it := keyOf("pk", pkSettings, "sk", skMaintenance)
	it["on"] = ddbitem.Bool(m.On)
	until, err := store.OptUnixNanos("until", m.Until)
	if err != nil {
		return fmt.Errorf("set maintenance: %w", err)
	}
	if until != nil {
		it["until"] = ddbitem.N(*until)
	}
	_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &s.tables.Orgs, Item: it})
	return store.Wrapf(err, "set maintenance")
}

// listOrg runs a query of one organization's items page by page, decodes each item, orders them
// by cmp (when not nil), and turns an empty listing of an unknown organization into
// store.ErrNotFound, as the embedded store does, at the cost of one read only when the listing is
// empty. A nil query is an empty range: nothing is read but the organization is still checked.
func listOrg[T any](ctx context.Context, s *Store, orgID string, in *dynamodb.QueryInput, decode func(item) (T, error), cmp func(a, b T) int) ([]T, error) {
	var out []T
	if in != nil {
		err := s.queryItems(ctx, in, func(it item) error {
			v, err := decode(it)
			out = append(out, v)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		_, err := s.org(ctx, orgID)
		return nil, err
	}
	if cmp != nil {
		slices.SortStableFunc(out, cmp)
	}
	return out, nil
}
