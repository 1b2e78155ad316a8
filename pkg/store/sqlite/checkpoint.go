package sqlite

import (
	"context"
	"database/sql"
	"time"
)

// Checkpoints copy the WAL's pages into the database file, so that the WAL can start over.
// SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000 pages: on
// the writer goroutine, copying a thousand pages and syncing while every admission queued
// behind it waits, which was most of the gateway's p99. So the write connection turns it off
// (wal_autocheckpoint=0) and the store checkpoints in two steps:
//
//  1. after commits, at most every checkpointEvery and once checkpointCommits commits have
//     gathered or checkpointWait has passed since the first of them, a goroutine copies the bulk
//     of the WAL on a connection of its own, in a PASSIVE checkpoint, which never waits for the
//     writer or for readers;
//  2. the writer goroutine then copies the few pages committed meanwhile, between two batches.
//     Only then is the whole WAL in the database file when the next write transaction begins,
//     and that transaction starts the WAL over (under constant writes step 1 alone never gets
//     there: new pages arrive while it copies).
const checkpointEvery = 100 * time.Millisecond

// A checkpoint syncs the WAL and the database file however few pages it copies: at 20 requests a
// second, one every checkpointEvery cost two checkpoints (steps 1 and 2) and four fsyncs per two
// requests, more CPU than the requests' own commits. So it waits for checkpointCommits commits
// (about 600 pages, under SQLite's own 1,000) or for checkpointWait after the first commit it
// has not copied; under load the commits gather within checkpointEvery anyway. At 20 requests a
// second a wait of 1 s still cost a checkpoint (four fsyncs, and the wake-ups of the timers that
// bracket it) every 20 requests; with 10 s the 100 commits come first, every 5 s, and only a
// slower trickle of commits is copied on the timer.
const (
	checkpointCommits = 100
	checkpointWait    = 10 * time.Second
)

// walSizeLimit is the write connection's journal_size_limit: the commit that starts the WAL over
// truncates a file longer than this, so that a burst does not leave a large file behind.
const walSizeLimit = 32 << 20

// walRestartPages: a WAL still this long after a checkpoint (long readers kept it from starting
// over) gets a RESTART checkpoint, which waits for them, so that it cannot grow without bound.
const walRestartPages = 10_000

// committed tells the checkpointer that the writer committed; it never blocks.
func (s *Store) committed() {
	s.uncopied.Add(1)
	select {
	case s.commits <- struct{}{}:
	default:
	}
}

// checkpointLoop is step 1, until the store closes.
func (s *Store) checkpointLoop() {
	defer close(s.checkpointed)
	for {
		select {
		case <-s.commits:
		case <-s.closing:
			return
		}
		if !s.gatherCommits() {
			return
		}
		// Commits made while the checkpoint runs are left for the next one.
		s.uncopied.Store(0)
		if s.checkpoint(context.Background(), s.c) {
			s.caughtUp.Store(true)
		}
		select {
		case <-time.After(checkpointEvery):
		case <-s.closing:
			return
		}
	}
}

// gatherCommits waits, after a commit, until checkpointCommits commits have gathered or
// checkpointWait has passed; false when the store closes meanwhile.
func (s *Store) gatherCommits() bool {
	wait := time.NewTimer(checkpointWait)
	defer wait.Stop()
	for s.uncopied.Load() < checkpointCommits {
		select {
		case <-s.commits:
		case <-wait.C:
			return true
		case <-s.closing:
			return false
		}
	}
	return true
}

// catchUp is step 2, on the writer goroutine between batches.
func (s *Store) catchUp() {
	if s.caughtUp.CompareAndSwap(true, false) {
		s.checkpoint(context.Background(), s.w)
	}
}

// checkpoint runs a passive checkpoint on db, and a restarting one when the WAL stays long. It
// reports whether it copied every page the WAL held when it began. Errors are not fatal: the
// pages stay in the WAL, where readers find them, until the next checkpoint.
func (s *Store) checkpoint(ctx context.Context, db *sql.DB) bool {
	var busy, pages, copied int
	if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &pages, &copied); err != nil {
		return false
	}
	if pages >= walRestartPages {
		_, _ = db.ExecContext(ctx, "PRAGMA wal_checkpoint(RESTART)")
	}
	return busy == 0 && copied == pages
}

// startCheckpointer opens the checkpoint connection and starts step 1.
func (s *Store) startCheckpointer(dsn string) error {
	var err error
	s.c, err = sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	s.c.SetMaxOpenConns(1)
	s.commits = make(chan struct{}, 1)
	s.closing = make(chan struct{})
	s.checkpointed = make(chan struct{})
	go s.checkpointLoop()
	return nil
}
