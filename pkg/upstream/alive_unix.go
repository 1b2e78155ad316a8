//go:build unix && !aix

package upstream

import (
	"net"
	"syscall"
)

// alive reports whether a kept-alive connection can take a request: the backend has neither closed
// it nor sent anything on it since its last response (a peek that does not wait, as database
// drivers check their pooled connections).
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	live := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		live = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && live
}
