// Package store declares what the gateway and kilnctl need from persistent state —
// organizations, keys, credits, in-flight slots, usage records and the maintenance window — so
// that the embedded SQLite store and the DynamoDB store can stand behind the same calls.
//
// Every method that depends on the time takes it as a parameter: leases expire against the
// caller's clock, and tests move that clock instead of sleeping.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/usage"
)

// Errors a caller decides something with. Implementations wrap them with the operation and key.
var (
	ErrNotFound            = errors.New("not found")
	ErrKeyRevoked          = errors.New("key revoked")
	ErrSuspended           = errors.New("organization suspended")
	ErrInsufficientCredits = errors.New("insufficient credits")
	ErrSlotsFull           = errors.New("in-flight limit reached")
	ErrLeaseLost           = errors.New("lease expired or released")
	ErrExists              = errors.New("already exists")
)

// DefaultMaxInFlight is an organization's in-flight limit unless set otherwise.
const DefaultMaxInFlight = 8

// DefaultLeaseTTL is how long an in-flight slot stays taken without renewal.
const DefaultLeaseTTL = 60 * time.Second

// OrgStatus is an organization's standing.
type OrgStatus string

const (
	OrgActive    OrgStatus = "active"
	OrgSuspended OrgStatus = "suspended"
)

// Org is an organization: the unit of billing, limits and data isolation.
type Org struct {
	ID          string       `json:"id"`
	Name        string       `json:"name"`
	Status      OrgStatus    `json:"status"`
	MaxInFlight int          `json:"max_in_flight"`
	Balance     money.Amount `json:"balance"`
	// Reserved is what the organization's requests in flight may still spend: the sum of their
	// leases' reservations. Available is Balance − Reserved.
	Reserved  money.Amount `json:"reserved"`
	CreatedAt time.Time    `json:"created_at"`
}

// Available is what a new request may reserve: the balance less what requests in flight hold.
func (o Org) Available() money.Amount { return o.Balance - o.Reserved }

// Key is an API key's stored form. The key itself is never stored: only its SHA-256 hash
// and its ID, which is the key's non-secret display prefix ("kiln-AbC123xY").
type Key struct {
	ID        string     `json:"id"`
	OrgID     string     `json:"org_id"`
	Hash      [32]byte   `json:"-"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Principal is who an API key speaks for, as authentication finds it.
type Principal struct {
	KeyID       string
	OrgID       string
	OrgStatus   OrgStatus
	MaxInFlight int
}

// Lease is an in-flight slot held by one request, named by the request's generation id, with the
// credits it reserved.
type Lease struct {
	OrgID    string
	HolderID string
	Expires  time.Time
	Reserved money.Amount
}

// AdmitRequest asks for an in-flight slot and a reservation: the organization must be active,
// have more than zero and at least Reserve available (balance less what its requests in flight
// reserved), and fewer than its limit of unexpired holders.
type AdmitRequest struct {
	OrgID    string
	HolderID string // the generation id
	Now      time.Time
	TTL      time.Duration // zero means DefaultLeaseTTL
	// Reserve is the most the request can cost; it is held from the balance until settlement.
	Reserve money.Amount
}

// Settlement ends a request: it releases the lease and its reservation, debits Event.Cost from
// the organization's balance once per generation id, and records the event (on DynamoDB the usage
// table's stream carries that record to the aggregator).
//
// The debit never takes the balance below zero. While the lease is held its reservation covers
// the debit, and what the reservation does not cover is taken from what the organization has
// available; a lease that expired and was purged has given its reservation back, and then the
// whole debit comes from what is available. Beyond what is available the debit is capped. A capped debit records the event at the debited cost (Estimated set) and reports
// the difference in SettleResult.WrittenOff.
type Settlement struct {
	Lease Lease
	Event usage.Event
	Now   time.Time
}

// SettleResult tells whether the settlement had already been applied (a replay changes nothing)
// and what of the event's cost could not be debited.
type SettleResult struct {
	AlreadyApplied bool
	WrittenOff     money.Amount
}

// Capped returns the cost to debit and the part written off, for a debit of cost against at most
// limit (never below zero).
func Capped(cost, limit money.Amount) (debit, writtenOff money.Amount) {
	limit = max(limit, 0)
	if cost <= limit {
		return cost, 0
	}
	return limit, cost - limit
}

// EntryKind is the kind of a ledger entry.
type EntryKind string

const (
	EntryTopUp      EntryKind = "top_up"
	EntryDebit      EntryKind = "debit"
	EntryAdjustment EntryKind = "adjustment"
)

// LedgerEntry is one change to an organization's balance. Debits carry the generation id as
// their ID and a negative amount.
type LedgerEntry struct {
	ID     string       `json:"id"`
	OrgID  string       `json:"org_id"`
	Kind   EntryKind    `json:"kind"`
	Amount money.Amount `json:"amount"`
	Note   string       `json:"note,omitempty"`
	At     time.Time    `json:"at"`
}

// Maintenance is the maintenance window; the gateway answers 503 until Until while On.
type Maintenance struct {
	On    bool      `json:"on"`
	Until time.Time `json:"until,omitempty"`
}

// Active reports whether the window is in force at now.
func (m Maintenance) Active(now time.Time) bool { return m.On && now.Before(m.Until) }

// Gateway is what the request path needs. Each method is one round trip on DynamoDB, except
// Authenticate, which reads the key and then its organization (two); the gateway caches its
// answer, so a request with a warm cache costs two round trips: Admit and Settle.
type Gateway interface {
	// Authenticate finds the key with this SHA-256 hash and its organization.
	// ErrNotFound for an unknown key, ErrKeyRevoked for a revoked one.
	Authenticate(ctx context.Context, keyHash [32]byte) (Principal, error)
	// Admit checks the organization (ErrSuspended, ErrInsufficientCredits when less than
	// max(Reserve, one picodollar) is available) and takes a slot (ErrSlotsFull) with its
	// reservation in one atomic step. Expired leases free their slots and reservations.
	Admit(ctx context.Context, req AdmitRequest) (Lease, error)
	// Release gives up a lease whose admission's outcome is unknown (the call failed or timed
	// out, and may yet have been applied): it removes the holder's lease and gives its
	// reservation back, if the lease is there, and reports whether it was.
	Release(ctx context.Context, lease Lease) (bool, error)
	// Renew extends an unexpired lease by ttl from now; ErrLeaseLost when it is gone.
	Renew(ctx context.Context, lease Lease, now time.Time, ttl time.Duration) (Lease, error)
	// Settle releases the lease, debits once and records the event, atomically. A settlement
	// whose generation id was already settled changes nothing and reports AlreadyApplied.
	// A lease that already expired is not an error: the debit and the record still happen.
	Settle(ctx context.Context, s Settlement) (SettleResult, error)
	// Generation returns the recorded event of one generation of this organization;
	// ErrNotFound when there is none or it belongs to another organization.
	Generation(ctx context.Context, orgID, generationID string) (usage.Event, error)
	// Org returns one organization with its current balance and reservations.
	Org(ctx context.Context, orgID string) (Org, error)
	// InFlight lists the organization's unexpired leases at now.
	InFlight(ctx context.Context, orgID string, now time.Time) ([]Lease, error)
	// Maintenance returns the maintenance window.
	Maintenance(ctx context.Context) (Maintenance, error)
}

// Admin is what operators' tooling needs on top of Gateway.
type Admin interface {
	CreateOrg(ctx context.Context, org Org) error // ErrExists when the ID is taken
	Orgs(ctx context.Context) ([]Org, error)
	SetOrgStatus(ctx context.Context, orgID string, status OrgStatus) error
	SetMaxInFlight(ctx context.Context, orgID string, n int) error
	CreateKey(ctx context.Context, key Key) error // ErrExists when the ID or hash is taken
	Keys(ctx context.Context, orgID string) ([]Key, error)
	RevokeKey(ctx context.Context, keyID string, at time.Time) error
	// AddEntry applies a top-up or adjustment; an entry whose ID exists changes nothing and
	// returns ErrExists.
	AddEntry(ctx context.Context, e LedgerEntry) error
	Ledger(ctx context.Context, orgID string) ([]LedgerEntry, error)
	// Usage lists an organization's recorded events started in [from, to). Their generation ids
	// are those the gateway makes, "gen-" and a ULID of the millisecond the request started: the
	// DynamoDB store finds them by the time in the id.
	Usage(ctx context.Context, orgID string, from, to time.Time) ([]usage.Event, error)
	SetMaintenance(ctx context.Context, m Maintenance) error
}

// Aggregates is the storage of the usage roll-ups that usage.Aggregator folds events into.
type Aggregates interface {
	// Fold writes the marker of d's generation id and adds d's totals to its organization's
	// day × model and month roll-ups, in one transaction. When the marker already exists it
	// changes nothing and reports applied false: redeliveries and replays are harmless.
	Fold(ctx context.Context, d usage.Delta) (applied bool, err error)
	// DailyRollups lists an organization's day × model roll-ups for the UTC days from..to
	// ("2026-11-01", both included), by day then model.
	DailyRollups(ctx context.Context, orgID, fromDay, toDay string) ([]usage.Rollup, error)
	// MonthlyRollups lists an organization's month roll-ups for the UTC months from..to
	// ("2026-11", both included), by month.
	MonthlyRollups(ctx context.Context, orgID, fromMonth, toMonth string) ([]usage.Rollup, error)
}

// Store is a complete store.
type Store interface {
	Gateway
	Admin
	Aggregates
	Close() error
}
