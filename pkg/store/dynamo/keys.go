package dynamo

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/neocloud/kiln/pkg/ddbitem"
	"github.com/neocloud/kiln/pkg/store"
)

// The keys table holds two items per key: the key item under "hash#" and the key's SHA-256 in
// hex, which authentication reads and the by-org index lists; and a claim under "id#" and the
// key ID, which makes IDs unique and lets RevokeKey find the hash.
const (
	keyByHashPrefix = "hash#"
	keyByIDPrefix   = "id#"
	// KeysByOrgIndex is the keys table's global secondary index: org_id, then key_id.
	KeysByOrgIndex = "by-org"
)

func hashKey(h [32]byte) item { return keyOf("pk", keyByHashPrefix+hex.EncodeToString(h[:])) }
func keyIDKey(id string) item { return keyOf("pk", keyByIDPrefix+id) }

// CreateKey stores a key's hash and claims its ID in one transaction that also checks that the
// organization exists. ErrExists when the ID or the hash is taken, ErrNotFound when the
// organization does not exist.
func (s *Store) CreateKey(ctx context.Context, key store.Key) error {
	return store.Wrapf(s.createKey(ctx, key), "create key %s", key.ID)
}

func (s *Store) createKey(ctx context.Context, key store.Key) error {
	created, err := store.CheckNewKey(key)
	if err != nil {
		return err
	}
	byHash := hashKey(key.Hash)
	byHash["key_id"] = ddbitem.S(key.ID)
	byHash["org_id"] = ddbitem.S(key.OrgID)
	if created != nil {
		byHash["created_at"] = ddbitem.N(*created)
	}
	byID := keyIDKey(key.ID)
	byID["key_hash"] = ddbitem.S(hex.EncodeToString(key.Hash[:]))
	c, err := s.transact(ctx, func() []types.TransactWriteItem {
		return []types.TransactWriteItem{
			{ConditionCheck: &types.ConditionCheck{TableName: &s.tables.Orgs, Key: orgKey(key.OrgID),
				ConditionExpression: aws.String("attribute_exists(pk)")}},
			{Put: &types.Put{TableName: &s.tables.Keys, Item: byID, ConditionExpression: aws.String("attribute_not_exists(pk)")}},
			{Put: &types.Put{TableName: &s.tables.Keys, Item: byHash, ConditionExpression: aws.String("attribute_not_exists(pk)")}},
		}
	})
	if err != nil {
		return err
	}
	if c != nil {
		if failed, _ := c.failed(0); failed {
			return fmt.Errorf("organization %s: %w", key.OrgID, store.ErrNotFound)
		}
		return store.ErrExists
	}
	return nil
}

func decodeKey(it item) (store.Key, error) {
	d := ddbitem.NewReader(it)
	k := store.Key{ID: d.Str("key_id"), OrgID: d.Str("org_id"), CreatedAt: optTime(d, "created_at")}
	h, err := hex.DecodeString(strings.TrimPrefix(d.Str("pk"), keyByHashPrefix))
	if err != nil || len(h) != len(k.Hash) {
		d.Fail("key %s: malformed hash", k.ID)
	}
	copy(k.Hash[:], h)
	if d.Has("revoked_at") {
		t := optTime(d, "revoked_at")
		k.RevokedAt = &t
	}
	return k, d.Err()
}

// Keys lists an organization's keys, oldest first, from the by-org index. The index is
// eventually consistent on AWS: a key created a moment ago may be missing for a fraction of a
// second; authentication reads the table itself and is not affected.
func (s *Store) Keys(ctx context.Context, orgID string) ([]store.Key, error) {
	keys, err := listOrg(ctx, s, orgID, &dynamodb.QueryInput{
		TableName:                 &s.tables.Keys,
		IndexName:                 aws.String(KeysByOrgIndex),
		KeyConditionExpression:    aws.String("org_id = :org"),
		ExpressionAttributeValues: item{":org": ddbitem.S(orgID)},
	}, decodeKey, func(a, b store.Key) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return keys, store.Wrapf(err, "keys of %s", orgID)
}

// RevokeKey revokes a key at the given time: it reads the key's claim for the hash, then sets
// revoked_at on the key item unless it is set already (revoking again keeps the first time).
func (s *Store) RevokeKey(ctx context.Context, keyID string, at time.Time) error {
	return store.Wrapf(s.revokeKey(ctx, keyID, at), "revoke key %s", keyID)
}

func (s *Store) revokeKey(ctx context.Context, keyID string, at time.Time) error {
	n, err := store.UnixNanos("revoked_at", at)
	if err != nil {
		return err
	}
	claim, err := s.get(ctx, &s.tables.Keys, keyIDKey(keyID))
	if err != nil {
		return err
	}
	d := ddbitem.NewReader(claim)
	h := d.Str("key_hash")
	if err := d.Err(); err != nil {
		return err
	}
	err = s.update(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.tables.Keys,
		Key:                       keyOf("pk", keyByHashPrefix+h),
		UpdateExpression:          aws.String("SET revoked_at = if_not_exists(revoked_at, :at)"),
		ConditionExpression:       aws.String("attribute_exists(pk)"),
		ExpressionAttributeValues: item{":at": ddbitem.N(n)},
	})
	if failed, _ := conditionFailed(err); failed {
		return store.ErrNotFound
	}
	return err
}

// Authenticate finds the key with this SHA-256 hash, then its organization: two strongly
// consistent reads. The gateway caches the answer for KILN_CACHE_TTL, so neither is on the
// request path while the cache is warm.
func (s *Store) Authenticate(ctx context.Context, keyHash [32]byte) (store.Principal, error) {
	// The hash is a secret's digest: it is never put into an error.
	it, err := s.get(ctx, &s.tables.Keys, hashKey(keyHash))
	if err != nil {
		return store.Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	k, err := decodeKey(it)
	if err != nil {
		return store.Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	if k.RevokedAt != nil {
		return store.Principal{}, fmt.Errorf("authenticate %s: %w", k.ID, store.ErrKeyRevoked)
	}
	o, err := s.org(ctx, k.OrgID)
	if err != nil {
		return store.Principal{}, fmt.Errorf("authenticate %s: organization %s: %w", k.ID, k.OrgID, err)
	}
	return store.Principal{KeyID: k.ID, OrgID: o.ID, OrgStatus: o.Status, MaxInFlight: o.MaxInFlight}, nil
}
