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

	"github.com/neocloud/kiln/pkg/money"
	"github.com/neocloud/kiln/pkg/store"
)

// A gateway's Store (Options.OwnSlots) holds the in-flight slots in memory instead of in the
// leases table: admission is then a read of the organization and a map update, not a write
// transaction that every request waits for, and a request's slot is free the moment it settles,
// before the settlement's commit. A lock file in the directory keeps a second such Store out,
// in this process or another, so the memory of this one sees every slot there is; a crashed
// gateway's slots go with its process. kilnctl and other Stores opened without OwnSlots keep
// using the leases table, which the owner keeps a copy of its slots in, so that `kilnctl org
// show` lists them: mirrorEvery after the first change it has not copied, a goroutine writes the
// holders that differ from its last copy, in a write that shares the settlements' commits, so
// the copy is at most that and a commit or two behind; slots that are back to what the table
// holds before then are not copied.

// LockName is the lock file a Store with OwnSlots holds in its directory.
const LockName = "gateway.lock"

// memSlots are the in-flight slots of a Store with OwnSlots: per organization, holder ID →
// expiry in Unix nanoseconds and reservation. Expired holders are dropped, and their reservations
// given back, when an admission finds them, as the leases table's are.
type memSlots struct {
	mu      sync.Mutex
	holders map[string]map[string]slot
	table   map[holder]slot     // what the leases table holds: the slots of the mirror's copies
	changed map[holder]struct{} // the holders whose slot differs from table's
	wake    chan struct{}       // the mirror has a change to copy
	copy    *time.Timer         // wakes the mirror mirrorEvery after the first change it has not copied
	armed   bool                // copy is running
}

// slot is one holder's lease: its expiry in Unix nanoseconds and its reservation in picodollars.
type slot struct {
	expires, reserved int64
}

// holder names one holder of an organization's slots.
type holder struct{ orgID, holderID string }

// slotChange is a changed holder as it is now: its slot, or none (held false) once freed.
type slotChange struct {
	holder
	slot
	held bool
}

func newMemSlots() *memSlots {
	m := &memSlots{holders: map[string]map[string]slot{}, table: map[holder]slot{}, changed: map[holder]struct{}{}, wake: make(chan struct{}, 1)}
	m.copy = time.AfterFunc(mirrorEvery, m.wakeMirror)
	m.copy.Stop()
	return m
}

func (m *memSlots) wakeMirror() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// change weighs the holder's slot, which just changed, against the leases table's; m.mu is held.
// The mirror copies mirrorEvery after the first difference it has not copied, unless the slots
// are back to what the table holds by then: at a low rate a request's settlement, a few
// milliseconds after its admission, leaves no slot, which the table already holds, and nothing
// wakes between requests.
func (m *memSlots) change(orgID, holderID string) {
	h := holder{orgID, holderID}
	sl, held := m.holders[orgID][holderID]
	if copied, ok := m.table[h]; ok == held && copied == sl {
		delete(m.changed, h)
	} else {
		m.changed[h] = struct{}{}
	}
	if differ := len(m.changed) > 0; differ != m.armed {
		if differ {
			m.copy.Reset(mirrorEvery)
		} else {
			m.copy.Stop()
		}
		m.armed = differ
	}
}

// admit takes a slot for holder under limit, at now until expires, reserving reserve of balance:
// what the organization's other holders reserve plus reserve must fit the balance.
func (m *memSlots) admit(orgID, holderID string, limit int, balance, reserve, now, expires int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.holders[orgID]
	if held == nil {
		held = map[string]slot{}
		m.holders[orgID] = held
	}
	reserved := int64(0)
	for h, sl := range held {
		if sl.expires <= now {
			delete(held, h)
			m.change(orgID, h)
			continue
		}
		reserved += sl.reserved
	}
	if _, ok := held[holderID]; ok {
		return fmt.Errorf("holder %s: %w", holderID, store.ErrExists)
	}
	if available := balance - reserved; available < reserve || available <= 0 {
		return store.ErrInsufficientCredits
	}
	if len(held) >= limit {
		return store.ErrSlotsFull
	}
	held[holderID] = slot{expires: expires, reserved: reserve}
	m.change(orgID, holderID)
	return nil
}

// reserved is what an organization's holders reserve, expired holders not yet dropped included.
func (m *memSlots) reserved(orgID string) money.Amount {
	m.mu.Lock()
	defer m.mu.Unlock()
	sum := int64(0)
	for _, sl := range m.holders[orgID] {
		sum += sl.reserved
	}
	return money.Amount(sum)
}

// othersReserved is what an organization's unexpired holders other than holderID reserve.
func (m *memSlots) othersReserved(orgID, holderID string, now int64) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	sum := int64(0)
	for h, sl := range m.holders[orgID] {
		if h != holderID && sl.expires > now {
			sum += sl.reserved
		}
	}
	return sum
}

// renew moves an unexpired holder's expiry; ErrLeaseLost when it is gone or expired.
func (m *memSlots) renew(orgID, holderID string, now, expires int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sl, ok := m.holders[orgID][holderID]
	if !ok || sl.expires <= now {
		return store.ErrLeaseLost
	}
	sl.expires = expires
	m.holders[orgID][holderID] = sl
	m.change(orgID, holderID)
	return nil
}

// release frees a holder's slot, if it holds one, and reports whether it did.
func (m *memSlots) release(orgID, holderID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.holders[orgID]
	_, ok := held[holderID]
	if ok {
		delete(held, holderID)
		m.change(orgID, holderID)
	}
	if len(held) == 0 {
		delete(m.holders, orgID)
	}
	return ok
}

// inFlight lists an organization's unexpired holders at now, by holder ID.
func (m *memSlots) inFlight(orgID string, now int64) []store.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	var leases []store.Lease
	for h, sl := range m.holders[orgID] {
		if sl.expires > now {
			leases = append(leases, store.Lease{OrgID: orgID, HolderID: h, Expires: store.FromUnixNanos(sl.expires), Reserved: money.Amount(sl.reserved)})
		}
	}
	slices.SortFunc(leases, func(a, b store.Lease) int { return strings.Compare(a.HolderID, b.HolderID) })
	return leases
}

// copied records that the leases table now holds cs, and weighs their holders against it again:
// one that changed while cs was written was weighed against the table as it was before, and is
// copied in its turn.
func (m *memSlots) copied(cs []slotChange) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range cs {
		if c.held {
			m.table[c.holder] = c.slot
		} else {
			delete(m.table, c.holder)
		}
		m.change(c.orgID, c.holderID)
	}
}

// changes returns the holders that differ from the leases table, as they are now: what the
// mirror writes is what changed, not every slot. They stay changed until copied.
func (m *memSlots) changes() []slotChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.armed = false // the copy woke the mirror; the next change arms it again
	if len(m.changed) == 0 {
		return nil
	}
	cs := make([]slotChange, 0, len(m.changed))
	for h := range m.changed {
		sl, held := m.holders[h.orgID][h.holderID]
		cs = append(cs, slotChange{h, sl, held})
	}
	return cs
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
	if err := s.clearLeases(context.Background()); err != nil {
		return err
	}
	s.mirrorStop = make(chan struct{})
	s.mirrorDone = make(chan struct{})
	go s.mirrorLoop()
	return nil
}

// mirrorEvery is how long the mirror waits after a change before it copies the slots to the
// leases table. Under load the slots change twice per request; copying every change cost a write
// of up to max_in_flight rows per change, for a table only `kilnctl org show` reads. At a low
// rate the wait takes in a request's settlement as well as its admission, a few milliseconds
// apart, and the slots are then what the table already holds (no slot, say): nothing is written,
// and since the settlement stops the wait (memSlots.change), nothing wakes either. Copying at
// once cost two commits per request, and the checkpoints that follow commits; waking the mirror
// after every request to find nothing to copy cost a tenth of the gateway's CPU at 20 req/s.
const mirrorEvery = 50 * time.Millisecond

// mirrorLoop copies the holders that differ from the leases table to it when memSlots.copy wakes
// it (the changes made meanwhile are in the same copy), one copy at a time, until Close.
func (s *Store) mirrorLoop() {
	defer close(s.mirrorDone)
	for {
		select {
		case <-s.slots.wake:
		case <-s.mirrorStop:
			return
		}
		cs := s.slots.changes()
		if len(cs) == 0 {
			continue
		}
		if err := s.mirror(context.Background(), cs); err != nil {
			// They stay changed, and are tried again after a longer pause (the store may be
			// refusing writes for a while); the slots themselves are in memory and unaffected.
			select {
			case <-time.After(time.Second):
				s.slots.wakeMirror()
			case <-s.mirrorStop:
				return
			}
			continue
		}
		s.slots.copied(cs)
	}
}

// mirror writes changed holders to the leases table, in one write: each slot held is inserted
// or updated, each freed one deleted.
func (s *Store) mirror(ctx context.Context, cs []slotChange) error {
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		put, free := s.stmt(ctx, tx, s.st.mirrorPut), s.stmt(ctx, tx, s.st.freeLease)
		for _, c := range cs {
			var err error
			if c.held {
				_, err = put.ExecContext(ctx, c.orgID, c.holderID, c.expires, c.reserved)
			} else {
				_, err = free.ExecContext(ctx, c.orgID, c.holderID)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// clearLeases empties the leases table.
func (s *Store) clearLeases(ctx context.Context) error {
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := s.stmt(ctx, tx, s.st.mirrorClear).ExecContext(ctx)
		return err
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
	s.slots.copy.Stop()
	return s.clearLeases(context.Background())
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
// before the change never replaces what the change left; and while a settlement of the
// organization is being written no copy is kept at all, since one read during the write may or
// may not hold its debit, which end then applies to the copy once the write committed.
type orgRows struct {
	mu       sync.Mutex
	rows     map[string]admitRow
	versions map[string]uint64
	pending  map[string]*pendingDebits
}

// pendingDebits are the settlements of one organization begun and not yet ended, and what they
// debit.
type pendingDebits struct {
	n   int
	sum int64
}

func newOrgRows() *orgRows {
	return &orgRows{rows: map[string]admitRow{}, versions: map[string]uint64{}, pending: map[string]*pendingDebits{}}
}

// begin caps a settlement's cost at what the organization can pay — its balance (the kept copy
// when there is one, else read, which the caller passes) less what other settlements being
// written debit and less the reservations of its other holders (others) — and records it as being
// written. It returns what to debit.
func (o *orgRows) begin(orgID string, read int64, cost int64, others func() int64) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.versions[orgID]++
	balance := read
	if r, ok := o.rows[orgID]; ok {
		balance = r.balance
	}
	p := o.pending[orgID]
	if p == nil {
		p = &pendingDebits{}
		o.pending[orgID] = p
	}
	debit, _ := store.Capped(money.Amount(cost), money.Amount(balance-p.sum-others()))
	p.n++
	p.sum += int64(debit)
	return int64(debit)
}

// end records that a settlement begun with begin was written, debiting committed of the planned
// debit (zero when it failed or changed nothing), and takes that off the kept copy, which was
// read before begin.
func (o *orgRows) end(orgID string, planned, committed int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.versions[orgID]++
	if p := o.pending[orgID]; p != nil {
		p.n--
		p.sum -= planned
		if p.n <= 0 {
			delete(o.pending, orgID)
		}
	}
	if r, ok := o.rows[orgID]; ok {
		r.balance -= committed
		o.rows[orgID] = r
	}
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

// put keeps a row read from the database, unless the organization changed since version or a
// settlement of it is being written.
func (o *orgRows) put(orgID string, r admitRow, version uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.versions[orgID] == version && o.pending[orgID] == nil {
		o.rows[orgID] = r
	}
}

// kept reports whether a copy of the organization's row is kept (of any age).
func (o *orgRows) kept(orgID string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.rows[orgID]
	return ok
}

// forget drops the kept row after a change this Store made to the organization.
func (o *orgRows) forget(orgID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.versions[orgID]++
	delete(o.rows, orgID)
}
