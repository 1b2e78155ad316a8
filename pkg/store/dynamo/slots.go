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

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// Items of the orgs table: each organization has one org item under its ID, which holds its
// status, limit, balance, what is available of the balance, and its lease map; the maintenance
// window is an item of its own.
//
// One item for all of it makes admission a single conditional UpdateItem: one round trip, one
// write unit, and no transaction — so that a flood of refused admissions (failed conditions on
// single writes) can never cancel the settlements' transactions on the same item, which
// DynamoDB cancels only for other transactions.
const (
	skOrg         = "org"
	pkSettings    = "#kiln"
	skMaintenance = "maintenance"
)

func orgKey(orgID string) item { return keyOf("pk", orgID, "sk", skOrg) }

// A lease map entry is {e: expiry in Unix nanoseconds, r: reserved picodollars}.
type leaseEntry struct {
	expires  int64
	reserved int64
}

func leaseValue(expires, reserved int64) types.AttributeValue {
	return &types.AttributeValueMemberM{Value: item{"e": ddbitem.N(expires), "r": ddbitem.N(reserved)}}
}

// maxAdmitRounds bounds the purge-and-retry rounds of one admission: a round is needed only when
// expired leases of crashed holders fill the map or hold the credits, and each round clears those
// it saw.
const maxAdmitRounds = 4

// purgeBatch is how many expired leases one purge removes, to stay well inside DynamoDB's limit
// on the length of an update expression.
const purgeBatch = 50

// Admit checks the organization, takes a lease and reserves its credits in one conditional
// UpdateItem of the org item:
//
//	SET leases.<holder> = {e: expiry, r: reserve}, available = available - reserve
//	IF status = active AND available >= reserve AND available > 0
//	   AND size(leases) < max_in_flight AND attribute_not_exists(leases.<holder>)
//
// When the condition fails, the item as it was decides the answer, in the contract's order: a
// missing item is ErrNotFound, a status other than active ErrSuspended, too little available
// ErrInsufficientCredits, then limit or more unexpired leases ErrSlotsFull. Expired leases of
// crashed holders still count in size(leases) and still hold their reservations: when they are
// what stands in the way, Admit removes them and gives their reservations back (each on the
// condition that it is unchanged) and tries again. A lease already held by this holder with this
// very expiry means an earlier try of this call committed (its response was lost): that is
// success. Another lease of the same holder is ErrExists.
func (s *Store) Admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	lease, err := s.admit(ctx, req)
	return lease, store.Wrapf(err, "admit %s", req.OrgID)
}

func (s *Store) admit(ctx context.Context, req store.AdmitRequest) (store.Lease, error) {
	now, expires, err := req.Times()
	if err != nil {
		return store.Lease{}, err
	}
	reserve := int64(req.Reserve)
	lease := store.Lease{OrgID: req.OrgID, HolderID: req.HolderID, Expires: store.FromUnixNanos(expires), Reserved: req.Reserve}
	in := &dynamodb.UpdateItemInput{
		TableName:        &s.tables.Orgs,
		Key:              orgKey(req.OrgID),
		UpdateExpression: aws.String("SET leases.#holder = :lease, available = available - :reserve"),
		ConditionExpression: aws.String("#status = :active AND available >= :reserve AND available > :zero" +
			" AND size(leases) < max_in_flight AND attribute_not_exists(leases.#holder)"),
		ExpressionAttributeNames: names("#holder", req.HolderID, "#status", "status"),
		ExpressionAttributeValues: item{
			":lease": leaseValue(expires, reserve), ":reserve": ddbitem.N(reserve),
			":active": ddbitem.S(string(store.OrgActive)), ":zero": ddbitem.N(0),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	for range maxAdmitRounds {
		err := s.update(ctx, in)
		if err == nil {
			return lease, nil
		}
		if itemTooLarge(err) {
			// The lease map holds several thousand leases; past DynamoDB's 400 KB item size the
			// organization has no room for more, whatever its limit says.
			return store.Lease{}, fmt.Errorf("lease map at the item size limit: %w", store.ErrSlotsFull)
		}
		failed, org := conditionFailed(err)
		if !failed {
			return store.Lease{}, err
		}
		if org == nil {
			return store.Lease{}, store.ErrNotFound
		}
		d := ddbitem.NewReader(org)
		status, available, limit := store.OrgStatus(d.Str("status")), d.Num("available"), d.Num("max_in_flight")
		leases := leaseMap(d, "leases")
		if err := d.Err(); err != nil {
			return store.Lease{}, fmt.Errorf("org item: %w", err)
		}
		if l, ok := leases[req.HolderID]; ok {
			if l.expires == expires && l.reserved == reserve {
				return lease, nil // an earlier try of this call took it
			}
			return store.Lease{}, fmt.Errorf("holder %s: %w", req.HolderID, store.ErrExists)
		}
		var expired []string
		held, freed := 0, int64(0)
		for holder, l := range leases {
			if l.expires > now {
				held++
			} else {
				expired = append(expired, holder)
				freed += l.reserved
			}
		}
		if err := store.Refusal(status, money.Amount(available+freed), req.Reserve, held, int(limit)); err != nil {
			return store.Lease{}, err
		}
		if len(expired) == 0 {
			return store.Lease{}, fmt.Errorf("org item refused a lease with %d of %d held, %d available and none expired", held, limit, available)
		}
		if err := s.purge(ctx, req.OrgID, expired, leases); err != nil {
			return store.Lease{}, err
		}
	}
	return store.Lease{}, fmt.Errorf("leases of %s kept changing during %d rounds", req.OrgID, maxAdmitRounds)
}

// purge removes expired leases from an organization's lease map and gives their reservations
// back to what is available, each only if it still has the expiry it was seen with: a lease
// renewed or released meanwhile is left alone. A purge that finds the map changed does nothing;
// the admission that asked for it looks again.
func (s *Store) purge(ctx context.Context, orgID string, expired []string, leases map[string]leaseEntry) error {
	slices.Sort(expired)
	for batch := range slices.Chunk(expired, purgeBatch) {
		var remove, cond []string
		n := map[string]string{}
		v := item{}
		freed := int64(0)
		for i, holder := range batch {
			h, e := "#h"+strconv.Itoa(i), ":e"+strconv.Itoa(i)
			n[h], v[e] = holder, ddbitem.N(leases[holder].expires)
			remove = append(remove, "leases."+h)
			cond = append(cond, "leases."+h+".e = "+e)
			freed += leases[holder].reserved
		}
		v[":freed"] = ddbitem.N(freed)
		err := s.update(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &s.tables.Orgs,
			Key:                       orgKey(orgID),
			UpdateExpression:          aws.String("REMOVE " + strings.Join(remove, ", ") + " SET available = available + :freed"),
			ConditionExpression:       aws.String(strings.Join(cond, " AND ")),
			ExpressionAttributeNames:  n,
			ExpressionAttributeValues: v,
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

// Release removes a lease and gives its reservation back, if the lease is held with this
// reservation: one conditional UpdateItem.
func (s *Store) Release(ctx context.Context, lease store.Lease) (bool, error) {
	if lease.OrgID == "" || lease.HolderID == "" {
		return false, nil
	}
	err := s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.tables.Orgs,
		Key:                       orgKey(lease.OrgID),
		UpdateExpression:          aws.String("REMOVE leases.#holder SET available = available + :reserved"),
		ConditionExpression:       aws.String("leases.#holder.r = :reserved"),
		ExpressionAttributeNames:  names("#holder", lease.HolderID),
		ExpressionAttributeValues: item{":reserved": ddbitem.N(int64(lease.Reserved))},
	})
	if failed, _ := conditionFailed(err); failed {
		return false, nil
	}
	return err == nil, store.Wrapf(err, "release %s of %s", lease.HolderID, lease.OrgID)
}

// Renew extends an unexpired lease to now+ttl (store.DefaultLeaseTTL when ttl is zero) with one
// conditional UpdateItem; ErrLeaseLost when the lease was released or had expired by now.
func (s *Store) Renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	renewed, err := s.renew(ctx, lease, now, ttl)
	return renewed, store.Wrapf(err, "renew %s of %s", lease.HolderID, lease.OrgID)
}

func (s *Store) renew(ctx context.Context, lease store.Lease, now time.Time, ttl time.Duration) (store.Lease, error) {
	if lease.OrgID == "" || lease.HolderID == "" {
		return store.Lease{}, store.ErrLeaseLost
	}
	n, expires, err := store.LeaseTimes(now, ttl)
	if err != nil {
		return store.Lease{}, err
	}
	err = s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.tables.Orgs,
		Key:                       orgKey(lease.OrgID),
		UpdateExpression:          aws.String("SET leases.#holder.e = :expires"),
		ConditionExpression:       aws.String("leases.#holder.e > :now"),
		ExpressionAttributeNames:  names("#holder", lease.HolderID),
		ExpressionAttributeValues: item{":expires": ddbitem.N(expires), ":now": ddbitem.N(n)},
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
// consistent read of its org item.
func (s *Store) InFlight(ctx context.Context, orgID string, now time.Time) ([]store.Lease, error) {
	leases, err := s.inFlight(ctx, orgID, now)
	return leases, store.Wrapf(err, "in flight of %s", orgID)
}

func (s *Store) inFlight(ctx context.Context, orgID string, now time.Time) ([]store.Lease, error) {
	n, err := store.UnixNanos("now", now)
	if err != nil {
		return nil, err
	}
	org, err := s.get(ctx, &s.tables.Orgs, orgKey(orgID))
	if err != nil {
		return nil, err
	}
	d := ddbitem.NewReader(org)
	leases := leaseMap(d, "leases")
	if err := d.Err(); err != nil {
		return nil, err
	}
	var held []store.Lease
	for holder, l := range leases {
		if l.expires > n {
			held = append(held, store.Lease{OrgID: orgID, HolderID: holder, Expires: store.FromUnixNanos(l.expires), Reserved: money.Amount(l.reserved)})
		}
	}
	slices.SortFunc(held, func(a, b store.Lease) int { return strings.Compare(a.HolderID, b.HolderID) })
	return held, nil
}

// leaseMap reads a lease map: holder ID → {e, r}.
func leaseMap(d *ddbitem.Reader, name string) map[string]leaseEntry {
	m := d.Map(name)
	out := make(map[string]leaseEntry, len(m))
	for holder, lv := range m {
		v, ok := lv.(*types.AttributeValueMemberM)
		if !ok {
			d.Fail("%s.%s: want a DynamoDB map (M)", name, holder)
			continue
		}
		sub := ddbitem.NewReader(v.Value)
		out[holder] = leaseEntry{expires: sub.Num("e"), reserved: sub.Num("r")}
		if err := sub.Err(); err != nil {
			d.Fail("%s.%s: %v", name, holder, err)
		}
	}
	return out
}
