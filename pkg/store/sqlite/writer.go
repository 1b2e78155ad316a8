package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
)

// maxBatch bounds how many queued writes share one transaction: enough to spread a commit over
// many requests, few enough that a batch holds the database lock, which kilnctl or a second
// gateway may be waiting for, only briefly.
const maxBatch = 64

// errClosed is what a write gets once Close has begun.
var errClosed = errors.New("store closed")

// A writeOp is one write waiting for, or being applied by, the writer goroutine.
type writeOp struct {
	fn func(ctx context.Context, tx *sql.Tx) error
	// checked: fn refuses (returns a refusal) only before it changes anything that must be
	// undone, so it runs without a savepoint of its own. See writeChecked.
	checked bool
	state   atomic.Int32
	err     error // fn's outcome, set by the writer
	final   bool  // err stands even if the batch is run again
	done    chan error
}

const (
	opQueued    int32 = iota
	opTaken           // the writer applies it; its caller waits for the result
	opAbandoned       // its caller left before the writer took it; it is never applied
)

// A refusal is an error that a checked write returns having changed nothing that needs undoing.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }
func (r refusal) Unwrap() error { return r.err }

// refuse marks err as a refusal; see writeChecked.
func refuse(err error) error { return refusal{err} }

// write runs fn in a BEGIN IMMEDIATE transaction on the write connection and returns its
// outcome once the transaction committed. fn may share the transaction with other callers'
// writes; it runs in a savepoint of its own, so an error from fn undoes only fn's changes.
//
// fn runs on the writer goroutine. It must use the context it is given, which is never
// cancelled (an interrupted statement could roll back the whole batch), and it may be run more
// than once, so it must set everything it hands back on every run.
//
// A caller whose ctx ends while its write is still queued gets ctx.Err() and the write never
// happens; once the writer has taken it, the caller waits for its true outcome, so nobody is
// ever told an applied write failed.
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.enqueue(ctx, &writeOp{fn: fn})
}

// writeChecked is write for the hot path's writes, without the cost of a savepoint: fn checks
// before it changes, and wraps the errors it returns before any change that would need undoing
// in refuse. Any other error from fn rolls back the whole batch, which is then run again with
// every write in a savepoint, and without fn, whose caller gets the error.
func (s *Store) writeChecked(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	err := s.enqueue(ctx, &writeOp{fn: fn, checked: true})
	if r, ok := err.(refusal); ok {
		return r.err
	}
	return err
}

func (s *Store) enqueue(ctx context.Context, op *writeOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op.done = make(chan error, 1) // the writer never waits for a caller
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return errClosed
	}
	select {
	case s.ops <- op:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case err := <-op.done:
		return err
	case <-ctx.Done():
		if op.state.CompareAndSwap(opQueued, opAbandoned) {
			return ctx.Err()
		}
		return <-op.done
	}
}

// writeLoop is the writer goroutine: it applies queued writes in batches, one transaction per
// batch, until Close closes the queue and everything queued has been applied.
//
// A batch is whatever is waiting when the last commit ends, and writes that arrive while a commit
// is under way share the next one: under load, one commit (and one WAL append of each page
// touched) serves many requests. A lone write commits at once, waiting for no others: a
// settlement commits before its answer ends (its debit is durable when the client sees the end),
// so a wait would be added to every answer, and under a closed loop of clients, who wait for
// their answers, no more settlements arrive during it.
func (s *Store) writeLoop() {
	defer close(s.stopped)
	batch := make([]*writeOp, 0, maxBatch)
	for op := range s.ops {
		batch = append(batch[:0], op)
	fill:
		for len(batch) < maxBatch {
			select {
			case op, ok := <-s.ops:
				if !ok {
					break fill
				}
				batch = append(batch, op)
			default:
				break fill
			}
		}
		s.apply(batch)
		clear(batch)
		s.catchUp()
	}
}

// How apply runs the writes of a batch.
type mode int

const (
	lone     mode = iota // one write, no savepoint: if it fails, the transaction is rolled back
	batched              // checked writes without a savepoint, the others each in their own
	cautious             // every write in its own savepoint, after a checked write failed
)

// apply runs a batch in one transaction, commits it once and hands every caller its outcome.
// When the transaction cannot begin or commit, every write of the batch gets that error: none
// of them was applied.
func (s *Store) apply(batch []*writeOp) {
	live := 0
	for _, op := range batch {
		if op.state.Load() == opQueued {
			live++
		}
	}
	if live == 0 {
		return
	}
	m := batched
	if live == 1 {
		m = lone
	}
	s.inlineSums = false
	for {
		again, err := s.try(batch, m)
		if again {
			m = cautious
			continue
		}
		for _, op := range batch {
			if op.state.Load() != opTaken {
				continue
			}
			if err != nil && !op.final {
				op.done <- err
			} else {
				op.done <- op.err
			}
		}
		return
	}
}

// try runs the batch's writes in one transaction and commits it. It reports again when a checked
// write failed other than by refusing: the transaction is rolled back, that write's error is
// final, and the rest of the batch must be run again, cautiously.
func (s *Store) try(batch []*writeOp, m mode) (again bool, err error) {
	ctx := context.Background()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		take(batch)
		return false, err
	}
	s.sums.reset()
	taken, failed := 0, false
	for _, op := range batch {
		if op.final || !op.take() {
			continue
		}
		taken++
		switch {
		case m == lone:
			op.err = op.fn(ctx, tx)
			failed = op.err != nil
		case m == batched && op.checked:
			op.err = op.fn(ctx, tx)
			if _, ok := op.err.(refusal); op.err != nil && !ok {
				op.final = true
				tx.Rollback()
				return true, nil
			}
		default:
			if err := s.savepoint(ctx, tx, op); err != nil {
				// The transaction itself is gone (SQLite rolls it back on some I/O
				// errors): nothing of the batch can be kept.
				tx.Rollback()
				take(batch)
				return false, err
			}
		}
	}
	if taken == 0 || failed {
		tx.Rollback()
		return false, nil
	}
	if err := s.writeSums(ctx, tx); err != nil {
		// A sum beyond what a column holds: run the batch again with every settlement
		// writing its own, so that the failure is the failing settlement's alone.
		tx.Rollback()
		if s.inlineSums {
			return false, err // cannot happen: nothing was summed
		}
		s.inlineSums = true
		return true, nil
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	s.committed()
	return false, nil
}

// savepoint runs op in a savepoint of its own, so that its failure undoes only its changes.
func (s *Store) savepoint(ctx context.Context, tx *sql.Tx, op *writeOp) error {
	if _, err := s.stmt(ctx, tx, s.st.savepoint).ExecContext(ctx); err != nil {
		return err
	}
	if op.err = op.fn(ctx, tx); op.err != nil {
		if _, err := s.stmt(ctx, tx, s.st.rollbackTo).ExecContext(ctx); err != nil {
			return errors.Join(op.err, err)
		}
	}
	_, err := s.stmt(ctx, tx, s.st.release).ExecContext(ctx)
	return err
}

// stmt returns the prepared statement st bound to tx, the writer's transaction, binding it at
// most once per transaction: Tx.StmtContext allocates a statement and takes the connection each
// time, and a batch runs the same few statements for every one of its writes. Only the writer's
// goroutine runs transactions on s.w, one at a time, so the cache needs no lock; a write's fn
// must call it only with the tx it was given.
func (s *Store) stmt(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	if s.boundTx != tx {
		s.boundTx = tx
		clear(s.bound)
	}
	b := s.bound[st]
	if b == nil {
		b = tx.StmtContext(ctx, st)
		s.bound[st] = b
	}
	return b
}

// take reports whether the writer may run op: it is still queued, and is now taken, so that its
// caller waits for its outcome; or it was taken for an earlier try of this batch. Callers that
// left before are dropped here, and never later.
func (op *writeOp) take() bool {
	return op.state.CompareAndSwap(opQueued, opTaken) || op.state.Load() == opTaken
}

// take takes every write of the batch whose caller still waits, so that none of them is applied
// later: the batch is about to fail as a whole.
func take(batch []*writeOp) {
	for _, op := range batch {
		op.take()
	}
}
