package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/neocloud/kiln/pkg/store"
)

// A gateway's Store (Options.OwnSlots) holds the in-flight slots in memory instead of in the
// leases table: admission is then a read of the organization and a map update, not a write
// transaction that every request waits for, and a request's slot is free the moment it settles,
// before the settlement's commit. A lock file in the directory keeps a second such Store out,
// in this process or another, so the memory of this one sees every slot there is; a crashed
// gateway's slots go with its process. kilnctl and other Stores opened without OwnSlots keep
// using the leases table, which the owner keeps a copy of its slots in, so that `kilnctl org
// show` lists them: after a change a goroutine rewrites it, in a write that shares the
// settlements' commits, at most every mirrorEvery, so the copy is at most that and a commit or
// two behind.

// LockName is the lock file a Store with OwnSlots holds in its directory.
const LockName = "gateway.lock"

// memSlots are the in-flight slots of a Store with OwnSlots: per organization, holder ID →
// expiry in Unix nanoseconds. Expired holders are dropped when an admission finds them, as the
// leases table's are.
type memSlots struct {
	mu      sync.Mutex
	holders map[string]map[string]int64
	changed bool          // since the last snapshot
	wake    chan struct{} // the mirror has a change to copy
}

func newMemSlots() *memSlots {
	return &memSlots{holders: map[string]map[string]int64{}, wake: make(chan struct{}, 1)}
}

// change records that the slots changed and wakes the mirror; m.mu is held.
func (m *memSlots) change() {
	m.changed = true
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// admit takes a slot for holder under limit, at now until expires.
func (m *memSlots) admit(orgID, holderID string, limit int, now, expires int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.holders[orgID]
	if held == nil {
		held = map[string]int64{}
		m.holders[orgID] = held
	}
	for h, exp := range held {
		if exp <= now {
			delete(held, h)
			m.change()
		}
	}
	if _, ok := held[holderID]; ok {
		return fmt.Errorf("holder %s: %w", holderID, store.ErrExists)
	}
	if len(held) >= limit {
		return store.ErrSlotsFull
	}
	held[holderID] = expires
	m.change()
	return nil
}

// renew moves an unexpired holder's expiry; ErrLeaseLost when it is gone or expired.
func (m *memSlots) renew(orgID, holderID string, now, expires int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	exp, ok := m.holders[orgID][holderID]
	if !ok || exp <= now {
		return store.ErrLeaseLost
	}
	m.holders[orgID][holderID] = expires
	m.change()
	return nil
}

// release frees a holder's slot, if it holds one.
func (m *memSlots) release(orgID, holderID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.holders[orgID]
	if _, ok := held[holderID]; ok {
		delete(held, holderID)
		m.change()
	}
	if len(held) == 0 {
		delete(m.holders, orgID)
	}
}

// inFlight lists an organization's unexpired holders at now, by holder ID.
func (m *memSlots) inFlight(orgID string, now int64) []store.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	var leases []store.Lease
	for h, exp := range m.holders[orgID] {
		if exp > now {
			leases = append(leases, store.Lease{OrgID: orgID, HolderID: h, Expires: store.FromUnixNanos(exp)})
		}
	}
	slices.SortFunc(leases, func(a, b store.Lease) int { return strings.Compare(a.HolderID, b.HolderID) })
	return leases
}

// snapshot returns every holder when the slots changed since the last snapshot.
func (m *memSlots) snapshot() (leases []store.Lease, changed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.changed {
		return nil, false
	}
	m.changed = false
	for org, held := range m.holders {
		for h, exp := range held {
			leases = append(leases, store.Lease{OrgID: org, HolderID: h, Expires: store.FromUnixNanos(exp)})
		}
	}
	return leases, true
}

// ownSlots takes the directory's lock file and starts the mirror; the leases table, whatever an
// earlier owner left in it, is emptied first.
func (s *Store) ownSlots() error {
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(s.path), LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := lockFile(lock); err != nil {
		lock.Close()
		return fmt.Errorf("another gateway holds %s: %w", lock.Name(), err)
	}
	s.lock = lock
	s.slots, s.orgs = newMemSlots(), newOrgRows()
	if err := s.mirror(context.Background(), nil); err != nil {
		return err
	}
	s.mirrorStop = make(chan struct{})
	s.mirrorDone = make(chan struct{})
	go s.mirrorLoop()
	return nil
}

// mirrorEvery is the least time between two copies of the slots to the leases table. Under load
// the slots change twice per request; copying every change cost a write of up to
// max_in_flight rows per change, for a table only `kilnctl org show` reads.
const mirrorEvery = 50 * time.Millisecond

// mirrorLoop copies the slots to the leases table after they changed, one copy at a time and
// at most every mirrorEvery (the changes made meanwhile are in the next copy), until Close.
func (s *Store) mirrorLoop() {
	defer close(s.mirrorDone)
	pause := time.NewTimer(mirrorEvery)
	pause.Stop()
	for {
		select {
		case <-s.slots.wake:
		case <-s.mirrorStop:
			return
		}
		leases, changed := s.slots.snapshot()
		if !changed {
			continue
		}
		wait := mirrorEvery
		if err := s.mirror(context.Background(), leases); err != nil {
			// Tried again after a longer pause (the store may be refusing writes for a
			// while); the slots themselves are in memory and unaffected.
			s.slots.mu.Lock()
			s.slots.change()
			s.slots.mu.Unlock()
			wait = time.Second
		}
		pause.Reset(wait)
		select {
		case <-pause.C:
		case <-s.mirrorStop:
			return
		}
	}
}

// mirror replaces the leases table's rows with leases, in one write.
func (s *Store) mirror(ctx context.Context, leases []store.Lease) error {
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := s.stmt(ctx, tx, s.st.mirrorClear).ExecContext(ctx); err != nil {
			return err
		}
		insert := s.stmt(ctx, tx, s.st.mirrorInsert)
		for _, l := range leases {
			if _, err := insert.ExecContext(ctx, l.OrgID, l.HolderID, l.Expires.UnixNano()); err != nil {
				return err
			}
		}
		return nil
	})
}

// releaseSlots stops the mirror, empties the leases table (no request is in flight any more)
// and releases the lock file. Close calls it before the writer stops.
func (s *Store) releaseSlots() error {
	if s.mirrorStop == nil {
		return nil
	}
	close(s.mirrorStop)
	<-s.mirrorDone
	return s.mirror(context.Background(), nil)
}

// orgTTL is how long a gateway's Store (OwnSlots) admits on an organization's row without reading
// it again: its own settlements and changes update the copy at once, and kilnctl's (another
// process) reach it within orgTTL, as a revoked key reaches the gateway's key cache.
const orgTTL = 250 * time.Millisecond

// admitRow is what admission reads of an organization.
type admitRow struct {
	status  store.OrgStatus
	balance int64 // picodollars
	limit   int
	read    time.Time
}

// orgRows are a gateway's Store's copies of the organization rows admission reads. Every change
// this Store makes to an organization bumps its version, so that a copy read from the database
// before the change never replaces what the change left.
type orgRows struct {
	mu       sync.Mutex
	rows     map[string]admitRow
	versions map[string]uint64
}

func newOrgRows() *orgRows {
	return &orgRows{rows: map[string]admitRow{}, versions: map[string]uint64{}}
}

// get returns the organization's row if one younger than orgTTL is kept, and otherwise the
// version to hand to put with the row read from the database.
func (o *orgRows) get(orgID string, now time.Time) (admitRow, uint64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.rows[orgID]
	if ok && now.Sub(r.read) < orgTTL {
		return r, 0, true
	}
	return admitRow{}, o.versions[orgID], false
}

// put keeps a row read from the database, unless the organization changed since version.
func (o *orgRows) put(orgID string, r admitRow, version uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.versions[orgID] == version {
		o.rows[orgID] = r
	}
}

// debit takes a settled cost off the kept balance.
func (o *orgRows) debit(orgID string, cost int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.versions[orgID]++
	if r, ok := o.rows[orgID]; ok {
		r.balance -= cost
		o.rows[orgID] = r
	}
}

// forget drops the kept row after a change this Store made to the organization.
func (o *orgRows) forget(orgID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.versions[orgID]++
	delete(o.rows, orgID)
}
