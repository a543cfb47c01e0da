//go:build !unix

package service

import (
	"errors"
	"os"
)

var errLocked = errors.New("locked by another process")

// lockFile does nothing where flock does not exist: nodepool is built and
// run on Unix; elsewhere the data directory is not guarded.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) error { return nil }
