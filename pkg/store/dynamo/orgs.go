package dynamo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// CreateOrg creates an organization with a zero balance — credits arrive only through the
// ledger — and its empty lease map, in one conditional PutItem. A zero MaxInFlight means
// store.DefaultMaxInFlight and an empty Status means active. ErrExists when the ID is taken.
func (s *Store) CreateOrg(ctx context.Context, org store.Org) error {
	if org.ID == "" {
		return fmt.Errorf("create org: %w", errEmptyID)
	}
	if org.Balance != 0 {
		return fmt.Errorf("create org %s: a new organization's balance is zero; add credits with a ledger entry", org.ID)
	}
	if org.MaxInFlight == 0 {
		org.MaxInFlight = store.DefaultMaxInFlight
	}
	if org.Status == "" {
		org.Status = store.OrgActive
	}
	if err := store.CheckOrg(org.Status, org.MaxInFlight); err != nil {
		return fmt.Errorf("create org %s: %w", org.ID, err)
	}
	orgItem := orgKey(org.ID)
	orgItem["id"] = sv(org.ID)
	orgItem["name"] = sv(org.Name)
	orgItem["status"] = sv(string(org.Status))
	orgItem["max_in_flight"] = nv(int64(org.MaxInFlight))
	orgItem["balance"] = nv(0)
	if !org.CreatedAt.IsZero() {
		created, err := store.UnixNanos("created_at", org.CreatedAt)
		if err != nil {
			return fmt.Errorf("create org %s: %w", org.ID, err)
		}
		orgItem["created_at"] = nv(created)
	}
	orgItem["available"] = nv(0)
	orgItem["leases"] = emptyMap()
	err := write(ctx, func() error {
		_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &s.tables.Orgs, Item: orgItem, ConditionExpression: aws.String("attribute_not_exists(pk)")})
		return err
	})
	if failed, _ := conditionFailed(err); failed {
		return fmt.Errorf("create org %s: %w", org.ID, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("create org %s: %w", org.ID, err)
	}
	return nil
}

func decodeOrg(it item) (store.Org, error) {
	d := decoder{it: it}
	o := store.Org{
		ID:          d.str("id"),
		Name:        d.str("name"),
		Status:      store.OrgStatus(d.str("status")),
		MaxInFlight: int(d.num("max_in_flight")),
		Balance:     money.Amount(d.num("balance")),
		CreatedAt:   d.optTime("created_at"),
	}
	o.Reserved = o.Balance - money.Amount(d.num("available"))
	return o, d.err
}

// Org returns one organization with its current balance, from a strongly consistent read.
func (s *Store) Org(ctx context.Context, orgID string) (store.Org, error) {
	o, err := s.org(ctx, orgID)
	if err != nil {
		return store.Org{}, fmt.Errorf("org %s: %w", orgID, err)
	}
	return o, nil
}

func (s *Store) org(ctx context.Context, orgID string) (store.Org, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.tables.Orgs, Key: orgKey(orgID), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return store.Org{}, err
	}
	if out.Item == nil {
		return store.Org{}, store.ErrNotFound
	}
	return decodeOrg(out.Item)
}

// orgExists reports store.ErrNotFound when the organization does not exist.
func (s *Store) orgExists(ctx context.Context, orgID string) error {
	_, err := s.org(ctx, orgID)
	return err
}

// Orgs lists every organization, by ID. It scans the orgs table, which is fine for operators'
// tooling and never used on the request path.
func (s *Store) Orgs(ctx context.Context) ([]store.Org, error) {
	var orgs []store.Org
	p := dynamodb.NewScanPaginator(s.db, &dynamodb.ScanInput{
		TableName:                 &s.tables.Orgs,
		FilterExpression:          aws.String("sk = :org"),
		ExpressionAttributeValues: item{":org": sv(skOrg)},
		ConsistentRead:            aws.Bool(true),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("orgs: %w", err)
		}
		for _, it := range page.Items {
			o, err := decodeOrg(it)
			if err != nil {
				return nil, fmt.Errorf("orgs: %w", err)
			}
			orgs = append(orgs, o)
		}
	}
	slices.SortFunc(orgs, func(a, b store.Org) int { return strings.Compare(a.ID, b.ID) })
	return orgs, nil
}

// SetOrgStatus suspends or resumes an organization.
func (s *Store) SetOrgStatus(ctx context.Context, orgID string, status store.OrgStatus) error {
	if err := store.CheckOrg(status, 1); err != nil {
		return fmt.Errorf("set status of %s: %w", orgID, err)
	}
	err := write(ctx, func() error {
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &s.tables.Orgs,
			Key:                       orgKey(orgID),
			UpdateExpression:          aws.String("SET #status = :status"),
			ConditionExpression:       aws.String("attribute_exists(pk)"),
			ExpressionAttributeNames:  names("#status", "status"),
			ExpressionAttributeValues: item{":status": sv(string(status))},
		})
		return err
	})
	if failed, _ := conditionFailed(err); failed {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("set status of %s: %w", orgID, err)
	}
	return nil
}

// SetMaxInFlight sets an organization's in-flight limit on its org item, where admission compares
// it with the number of leases. Holders above a lowered limit keep their leases until they
// release them.
func (s *Store) SetMaxInFlight(ctx context.Context, orgID string, n int) error {
	if err := store.CheckOrg(store.OrgActive, n); err != nil {
		return fmt.Errorf("set limit of %s: %w", orgID, err)
	}
	err := write(ctx, func() error {
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &s.tables.Orgs,
			Key:                       orgKey(orgID),
			UpdateExpression:          aws.String("SET max_in_flight = :n"),
			ConditionExpression:       aws.String("attribute_exists(pk)"),
			ExpressionAttributeValues: item{":n": nv(int64(n))},
		})
		return err
	})
	if failed, _ := conditionFailed(err); failed {
		return fmt.Errorf("set limit of %s: %w", orgID, store.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("set limit of %s: %w", orgID, err)
	}
	return nil
}

// Maintenance returns the maintenance window; off when none was ever set.
func (s *Store) Maintenance(ctx context.Context) (store.Maintenance, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &s.tables.Orgs,
		Key:            keyOf("pk", pkSettings, "sk", skMaintenance),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.Maintenance{}, fmt.Errorf("maintenance: %w", err)
	}
	if out.Item == nil {
		return store.Maintenance{}, nil
	}
	d := decoder{it: out.Item}
	m := store.Maintenance{On: d.boolean("on"), Until: d.optTime("until")}
	if d.err != nil {
		return store.Maintenance{}, fmt.Errorf("maintenance: %w", d.err)
	}
	return m, nil
}

// SetMaintenance replaces the maintenance window.
func (s *Store) SetMaintenance(ctx context.Context, m store.Maintenance) error {
	it := keyOf("pk", pkSettings, "sk", skMaintenance)
	it["on"] = bv(m.On)
	if !m.Until.IsZero() {
		until, err := store.UnixNanos("until", m.Until)
		if err != nil {
			return fmt.Errorf("set maintenance: %w", err)
		}
		it["until"] = nv(until)
	}
	if _, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &s.tables.Orgs, Item: it}); err != nil {
		return fmt.Errorf("set maintenance: %w", err)
	}
	return nil
}

// listOrg runs a query of one organization's items page by page, decodes each item, and turns an
// empty listing of an unknown organization into store.ErrNotFound (notFoundIfNoOrg). A nil query
// is an empty range: nothing is read but the organization is still checked.
func listOrg[T any](ctx context.Context, s *Store, orgID string, in *dynamodb.QueryInput, decode func(item) (T, error)) ([]T, error) {
	var out []T
	if in != nil {
		p := dynamodb.NewQueryPaginator(s.db, in)
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				return nil, err
			}
			for _, it := range page.Items {
				v, err := decode(it)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
		}
	}
	if err := s.notFoundIfNoOrg(ctx, orgID, len(out)); err != nil {
		return nil, err
	}
	return out, nil
}

// notFoundIfNoOrg turns an empty listing of an unknown organization into store.ErrNotFound, as
// the embedded store does, at the cost of one read only when the listing is empty.
func (s *Store) notFoundIfNoOrg(ctx context.Context, orgID string, n int) error {
	if n > 0 {
		return nil
	}
	if err := s.orgExists(ctx, orgID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return store.ErrNotFound
		}
		return err
	}
	return nil
}
