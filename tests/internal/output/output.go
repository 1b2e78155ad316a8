// Package output collects what the processes the end-to-end tests start write, for the tests'
// failure messages.
package output

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that a process's output can be written to while a test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
