package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"
)

// HoldWriter occupies the writer goroutine with a write of its own until release is called:
// the writes queued meanwhile share the batch that follows, as writes that arrive while a commit
// is under way do. Tests batch writes through the real API so.
func (s *Store) HoldWriter(t testing.TB) (release func()) {
	t.Helper()
	taken, free, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	go func() {
		done <- s.write(context.Background(), func(context.Context, *sql.Tx) error {
			once.Do(func() { close(taken) })
			<-free
			return nil
		})
	}()
	<-taken
	return func() {
		t.Helper()
		close(free)
		if err := <-done; err != nil {
			t.Errorf("the held write: %v", err)
		}
	}
}

// WaitQueued waits until n writes are queued for the writer, for at most 10 s: fewer than n
// is the test's failure, not a hang (the caller still releases the writer).
func (s *Store) WaitQueued(t testing.TB, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(s.ops) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("%d writes queued after 10 s, want %d", len(s.ops), n)
			return
		}
	}
}
