package dynamo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/store"
)

// Items of the orgs table: each organization has an org item and a slots item under its ID;
// the maintenance window is an item of its own.
const (
	skOrg         = "org"
	skSlots       = "slots"
	pkSettings    = "#kiln"
	skMaintenance = "maintenance"
)

func orgKey(orgID string) item   { return keyOf("pk", orgID, "sk", skOrg) }
func slotsKey(orgID string) item { return keyOf("pk", orgID, "sk", skSlots) }

// maxAdmitRounds bounds the purge-and-retry rounds of one admission: a round is needed only when
// expired leases of crashed holders fill the map, and each round clears those it saw.
const maxAdmitRounds = 4

// purgeBatch is how many expired leases one purge removes, to stay well inside DynamoDB's limit
// on the length of an update expression.
const purgeBatch = 50

// Admit checks the organization and takes a lease in one TransactWriteItems:
//
//  1. a ConditionCheck on the org item: status = active AND balance > 0;
//  2. an Update of the slots item: SET leases.<holder> = <expiry>, on the condition that the
//     holder has no lease yet and size(leases) < limit.
//
// When DynamoDB cancels it, the items as they were decide the answer, in the contract's order:
// a missing org item is ErrNotFound, a status other than active ErrSuspended, a balance ≤ 0
// ErrInsufficientCredits; then limit or more unexpired leases are ErrSlotsFull. Expired leases
// of crashed holders still count in size(leases): when they are what fills the map, Admit
// removes them (each on the condition that it is unchanged) and tries again. A lease already
// held by this holder with this very expiry means an earlier try of this call committed (its
// response was lost): that is success. Another lease of the same holder is ErrExists.
func (s *Store) Admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	lease, err := s.admit(ctx, req)
	if err != nil {
		return store.Lease{}, fmt.Errorf("admit %s: %w", req.OrgID, err)
	}
	return lease, nil
}

func (s *Store) admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	now, expires, err := req.Times()
	if err != nil {
		return store.Lease{}, err
	}
	lease := store.Lease{OrgID: req.OrgID, HolderID: req.HolderID, Expires: store.FromUnixNanos(expires)}
	build := func() []types.TransactWriteItem {
		return []types.TransactWriteItem{
			{ConditionCheck: &types.ConditionCheck{
				TableName:                           &s.tables.Orgs,
				Key:                                 orgKey(req.OrgID),
				ConditionExpression:                 aws.String("#status = :active AND balance > :zero"),
				ExpressionAttributeNames:            names("#status", "status"),
				ExpressionAttributeValues:           item{":active": sv(string(store.OrgActive)), ":zero": nv(0)},
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}},
			{Update: &types.Update{
				TableName:                           &s.tables.Orgs,
				Key:                                 slotsKey(req.OrgID),
				UpdateExpression:                    aws.String("SET leases.#holder = :expires"),
				ConditionExpression:                 aws.String("attribute_not_exists(leases.#holder) AND size(leases) < #limit"),
				ExpressionAttributeNames:            names("#holder", req.HolderID, "#limit", "limit"),
				ExpressionAttributeValues:           item{":expires": nv(expires)},
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}},
		}
	}
	for range maxAdmitRounds {
		c, err := s.transact(ctx, build)
		if itemTooLarge(err) {
			// The lease map holds several thousand leases; past DynamoDB's 400 KB item size the
			// organization has no room for more, whatever its limit says.
			return store.Lease{}, fmt.Errorf("lease map at the item size limit: %w", store.ErrSlotsFull)
		}
		if err != nil {
			return store.Lease{}, err
		}
		if c == nil {
			return lease, nil
		}
		if failed, org := c.failed(0); failed {
			return store.Lease{}, orgRefusal(org)
		}
		failed, slots := c.failed(1)
		if !failed {
			return store.Lease{}, fmt.Errorf("transaction cancelled: %v", c)
		}
		if slots == nil {
			return store.Lease{}, store.ErrNotFound
		}
		d := decoder{it: slots}
		limit, leases := d.num("limit"), d.leases("leases")
		if d.err != nil {
			return store.Lease{}, fmt.Errorf("slots item: %w", d.err)
		}
		if exp, ok := leases[req.HolderID]; ok {
			if exp == expires {
				return lease, nil // an earlier try of this call took it
			}
			return store.Lease{}, fmt.Errorf("holder %s: %w", req.HolderID, store.ErrExists)
		}
		var expired []string
		held := int64(0)
		for holder, exp := range leases {
			if exp > now {
				held++
			} else {
				expired = append(expired, holder)
			}
		}
		if held >= limit {
			return store.Lease{}, store.ErrSlotsFull
		}
		if len(expired) == 0 {
			return store.Lease{}, fmt.Errorf("slots item refused a lease with %d of %d held and none expired", held, limit)
		}
		if err := s.purge(ctx, req.OrgID, expired, leases); err != nil {
			return store.Lease{}, err
		}
	}
	return store.Lease{}, fmt.Errorf("slots of %s kept changing during %d rounds", req.OrgID, maxAdmitRounds)
}

// orgRefusal names the reason the org item refused an admission, from the item as it was.
func orgRefusal(org item) error {
	if org == nil {
		return store.ErrNotFound
	}
	d := decoder{it: org}
	status, balance := store.OrgStatus(d.str("status")), d.num("balance")
	switch {
	case d.err != nil:
		return fmt.Errorf("org item: %w", d.err)
	case status != store.OrgActive:
		return store.ErrSuspended
	case balance <= 0:
		return store.ErrInsufficientCredits
	}
	return fmt.Errorf("org item refused an admission while active with balance %d", balance)
}

// purge removes expired leases from an organization's lease map, each only if it still has the
// expiry it was seen with: a lease renewed or released meanwhile is left alone. A purge that
// finds the map changed does nothing; the admission that asked for it looks again.
func (s *Store) purge(ctx context.Context, orgID string, expired []string, leases map[string]int64) error {
	slices.Sort(expired)
	for batch := range slices.Chunk(expired, purgeBatch) {
		var remove, cond []string
		n := map[string]string{}
		v := item{}
		for i, holder := range batch {
			h, e := "#h"+strconv.Itoa(i), ":e"+strconv.Itoa(i)
			n[h], v[e] = holder, nv(leases[holder])
			remove = append(remove, "leases."+h)
			cond = append(cond, "leases."+h+" = "+e)
		}
		err := write(ctx, func() error {
			_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:                 &s.tables.Orgs,
				Key:                       slotsKey(orgID),
				UpdateExpression:          aws.String("REMOVE " + strings.Join(remove, ", ")),
				ConditionExpression:       aws.String(strings.Join(cond, " AND ")),
				ExpressionAttributeNames:  n,
				ExpressionAttributeValues: v,
			})
			return err
		})
		if failed, _ := conditionFailed(err); failed {
			return nil
		}
		if err != nil {
			return fmt.Errorf("purge expired leases: %w", err)
		}
	}
	return nil
}

// Renew extends an unexpired lease to now+ttl (store.DefaultLeaseTTL when ttl is zero) with one
// conditional UpdateItem; ErrLeaseLost when the lease was released or had expired by now.
func (s *Store) Renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	renewed, err := s.renew(ctx, lease, now, ttl)
	if err != nil {
		return store.Lease{}, fmt.Errorf("renew %s of %s: %w", lease.HolderID, lease.OrgID, err)
	}
	return renewed, nil
}

func (s *Store) renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	if lease.OrgID == "" || lease.HolderID == "" {
		return store.Lease{}, store.ErrLeaseLost
	}
	ttl, err := store.LeaseTTL(ttl)
	if err != nil {
		return store.Lease{}, err
	}
	n, err := store.UnixNanos("now", now)
	if err != nil {
		return store.Lease{}, err
	}
	expires, err := store.UnixNanos("expiry", now.Add(ttl))
	if err != nil {
		return store.Lease{}, err
	}
	err = write(ctx, func() error {
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &s.tables.Orgs,
			Key:                       slotsKey(lease.OrgID),
			UpdateExpression:          aws.String("SET leases.#holder = :expires"),
			ConditionExpression:       aws.String("leases.#holder > :now"),
			ExpressionAttributeNames:  names("#holder", lease.HolderID),
			ExpressionAttributeValues: item{":expires": nv(expires), ":now": nv(n)},
		})
		return err
	})
	if failed, _ := conditionFailed(err); failed {
		return store.Lease{}, store.ErrLeaseLost
	}
	if err != nil {
		return store.Lease{}, err
	}
	lease.Expires = store.FromUnixNanos(expires)
	return lease, nil
}

// InFlight lists the organization's unexpired leases at now, by holder ID, from one strongly
// consistent read of its slots item.
func (s *Store) InFlight(ctx context.Context, orgID string, now time.Time) ([]store.Lease, error) {
	leases, err := s.inFlight(ctx, orgID, now)
	if err != nil {
		return nil, fmt.Errorf("in flight of %s: %w", orgID, err)
	}
	return leases, nil
}

func (s *Store) inFlight(ctx context.Context, orgID string, now time.Time) ([]store.Lease, error) {
	n, err := store.UnixNanos("now", now)
	if err != nil {
		return nil, err
	}
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &s.tables.Orgs,
		Key:            slotsKey(orgID),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, err
	}
	if out.Item == nil {
		return nil, store.ErrNotFound
	}
	d := decoder{it: out.Item}
	leases := d.leases("leases")
	if d.err != nil {
		return nil, d.err
	}
	var held []store.Lease
	for holder, exp := range leases {
		if exp > n {
			held = append(held, store.Lease{OrgID: orgID, HolderID: holder, Expires: store.FromUnixNanos(exp)})
		}
	}
	slices.SortFunc(held, func(a, b store.Lease) int { return strings.Compare(a.HolderID, b.HolderID) })
	return held, nil
}
