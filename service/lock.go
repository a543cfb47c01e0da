package service

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// LockFile is the file, in the data directory, that the process running
// the embedded NATS server holds an exclusive OS lock on (flock), so that
// a second process can never open the same JetStream store: two servers on
// one store corrupt it.
const LockFile = "nodepool.lock"

// ErrDataDirInUse: another process holds the data directory.
var ErrDataDirInUse = errors.New("data directory in use")

// DataDirLock is a held lock on a data directory.
type DataDirLock struct {
	f *os.File
}

// LockDataDir takes the lock of a data directory (creating the directory
// if needed) and writes who holds it into the lock file. If another
// process holds it, the error wraps ErrDataDirInUse and names the holder.
func LockDataDir(dir, holder string) (*DataDirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating data directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := lockFile(f); err != nil {
		who, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, errLocked) {
			abs, _ := filepath.Abs(dir)
			return nil, fmt.Errorf("%w: %s is held by another nodepool process (%s); stop it, or give this one another NODEPOOL_DATA_DIR (--data-dir)",
				ErrDataDirInUse, abs, strings.TrimSpace(string(who)))
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = fmt.Fprintf(f, "pid %d, %s, since %s\n", os.Getpid(), holder, time.Now().UTC().Format(time.RFC3339))
	}
	return &DataDirLock{f: f}, nil
}

// Release gives the lock up.
func (l *DataDirLock) Release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = unlockFile(l.f)
	_ = l.f.Close()
	l.f = nil
}
