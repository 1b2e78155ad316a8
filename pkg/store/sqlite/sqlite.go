// Package sqlite is the embedded store: one SQLite database file in WAL mode that the gateway
// and kilnctl can open at the same time, from separate processes.
//
// Every write goes through one writer goroutine and one connection, in BEGIN IMMEDIATE
// transactions, so two writers queue on the database lock (under busy_timeout) instead of
// deadlocking on a read-to-write upgrade, and readers on their own connections never wait for a
// writer. Writes that queue up while a transaction commits share the next one (group commit),
// each in a savepoint of its own or checked before it changes anything, so that one write's
// failure stays its own. Every settlement folds its event into the store's own aggregates in its
// transaction: the embedded store has no stream to carry events to an aggregator. The gateway's
// Store (Options.OwnSlots) keeps the in-flight slots in memory instead, one gateway per directory
// (memslots.go). Money is INTEGER picodollars and times are INTEGER Unix nanoseconds,
// so sums, orderings and expiry comparisons are exact.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// FileName is the name of the database file inside the store's directory.
const FileName = "kiln.db"

// busyTimeout is how long a statement waits for another connection's lock, perhaps held by the
// other process, before it fails with SQLITE_BUSY.
const busyTimeout = 5 * time.Second

// Store is the embedded store. It is safe for concurrent use, and other Stores (in this or other
// processes) may use the same directory at the same time.
type Store struct {
	path string
	opt  Options
	w    *sql.DB // one connection, used only by the writer goroutine; transactions begin IMMEDIATE
	r    *sql.DB // read-only connections
	st   statements

	c            *sql.DB       // the checkpointer's connection (checkpoint.go)
	commits      chan struct{} // the writer committed; see committed
	uncopied     atomic.Int64  // commits since the checkpointer last began (checkpoint.go)
	closing      chan struct{} // closed by Close: the checkpointer stops
	checkpointed chan struct{} // closed when the checkpointer has stopped
	caughtUp     atomic.Bool   // the checkpointer copied the WAL; the writer should copy the rest

	slots      *memSlots     // with OwnSlots; nil otherwise
	orgs       *orgRows      // with OwnSlots: the organization rows admission reads
	lock       *os.File      // with OwnSlots: the directory's lock file, held
	mirrorStop chan struct{} // closed by Close: the mirror stops
	mirrorDone chan struct{} // closed when the mirror has stopped

	ops     chan *writeOp           // writes for the writer goroutine
	stopped chan struct{}           // closed when the writer goroutine has ended
	boundTx *sql.Tx                 // the writer's transaction that bound holds statements of
	bound   map[*sql.Stmt]*sql.Stmt // prepared statement → bound to boundTx (Store.stmt)
	sums    batchSums               // the writer's batch: its settlements' debits and roll-ups (sums.go)
	// inlineSums: the batch runs again with each settlement writing its debit and roll-up.
	inlineSums bool
	mu         sync.RWMutex // guards closed against sends on ops
	closed     bool

	closeOnce sync.Once
	closeErr  error
}

// Options change how a Store holds the in-flight slots.
type Options struct {
	// OwnSlots: this Store is the gateway's, the only one admitting requests on the directory;
	// it holds the in-flight slots in memory, behind a lock file (memslots.go). Without it,
	// slots are leases in the database, which several processes can share.
	OwnSlots bool
}

// Open opens the store in dir with opt, creating the directory (mode 0700) and the database as
// needed, and brings the schema up to date.
func Open(dir string, opt Options) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	if strings.ContainsRune(path, '?') {
		// The driver reads everything after '?' as connection parameters.
		return nil, fmt.Errorf("open store %s: path must not contain '?'", dir)
	}
	s := &Store{path: path, opt: opt, bound: map[*sql.Stmt]*sql.Stmt{}, sums: newBatchSums()}
	if err := s.open(); err != nil {
		s.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

func (s *Store) open() error {
	common := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)",
		busyTimeout.Milliseconds())
	var err error
	s.w, err = sql.Open("sqlite", s.path+"?"+common+"&_pragma=journal_mode(WAL)&_pragma=wal_autocheckpoint(0)"+
		fmt.Sprintf("&_pragma=journal_size_limit(%d)", walSizeLimit)+"&_txlock=immediate")
	if err != nil {
		return err
	}
	// One connection serves every write: SQLite admits one writer at a time anyway, and a single
	// connection keeps the prepared statements warm.
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	ctx := context.Background()
	if err := migrate(ctx, s.w); err != nil {
		return err
	}
	// Readers open after the writer has switched the file to WAL, which persists.
	s.r, err = sql.Open("sqlite", s.path+"?"+common+"&_pragma=query_only(1)")
	if err != nil {
		return err
	}
	s.r.SetMaxIdleConns(4)
	if err := s.st.prepare(ctx, s.w, s.r); err != nil {
		return err
	}
	if err := s.startCheckpointer(s.path + "?" + common); err != nil {
		return err
	}
	s.ops = make(chan *writeOp, 4*maxBatch)
	s.stopped = make(chan struct{})
	go s.writeLoop()
	if s.opt.OwnSlots {
		return s.ownSlots()
	}
	return nil
}

// Close applies the writes already queued, then releases the database; writes after Close fail.
// Closing again returns the first Close's outcome.
// Leases still held stay in the file until they expire.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Store) close() error {
	var errs []error
	if s.slots != nil {
		errs = append(errs, s.releaseSlots())
	}
	if s.ops != nil {
		s.mu.Lock()
		if !s.closed {
			s.closed = true
			close(s.ops)
		}
		s.mu.Unlock()
		<-s.stopped
	}
	if s.closing != nil {
		close(s.closing)
		<-s.checkpointed
	}
	errs = append(errs, s.st.close())
	if s.c != nil {
		errs = append(errs, s.c.Close())
	}
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close())
	}
	return errors.Join(errs...)
}
