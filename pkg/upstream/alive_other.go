//go:build !unix || aix

package upstream

import "net"

// alive cannot peek at a socket here; a connection the backend closed fails its next request.
func alive(net.Conn) bool { return true }
