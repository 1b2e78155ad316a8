//go:build !unix

package sqlite

import "os"

// lockFile does nothing where flock(2) does not exist: there, run one gateway per directory.
func lockFile(*os.File) error { return nil }
