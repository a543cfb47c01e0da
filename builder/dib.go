package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/kv"
)

// errTimeout marks a build that ran past its build-timeout.
var errTimeout = errors.New("build-timeout exceeded")

// buildDir is where a build writes its files.
func (b *Builder) buildDir(image, build string) string {
	return filepath.Join(b.opts.ImagesDir, image+"-"+build)
}

// logPath is a build's log file: <build-log-dir>/<image>-<build-id>.log, as
// in Nodepool.
func (b *Builder) logPath(image, build string) string {
	return filepath.Join(b.opts.BuildLogDir, image+"-"+build+".log")
}

// dibArgs is the command line of a build, as Nodepool makes it:
// dib-cmd -x -t <formats> --no-tmpfs -o <output> <elements...>.
func dibArgs(di *config.Diskimage, formats []string, output string) []string {
	args := strings.Fields(di.DibCmd)
	args = append(args, "-x", "-t", strings.Join(formats, ","), "--no-tmpfs", "-o", output)
	return append(args, di.Elements...)
}

// runDib runs a build's command with its log, in a process group of its
// own, and returns the path of the file of each format. When ctx ends (the
// build-timeout, a lost lease, a stop), every process of the build is
// killed.
func (b *Builder) runDib(ctx context.Context, di *config.Diskimage, build *kv.ImageBuild, formats []string) (map[string]string, error) {
	dir := b.buildDir(build.Image, build.ID)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	output := filepath.Join(dir, build.Image+"-"+build.ID)
	args := dibArgs(di, formats, output)
	if strings.Contains(args[0], "/") && !filepath.IsAbs(args[0]) {
		// A relative dib-cmd is relative to where nodepool runs, not to
		// the build's folder, where the command runs.
		if abs, err := filepath.Abs(args[0]); err == nil {
			args[0] = abs
		}
	}
	env := b.config().Env(di)

	b.pruneLogs(build.Image)
	logf, err := os.OpenFile(build.Log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the build log: %w", err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "# nodepool: build %s-%s by %s, started %s\n# command: %s\n# environment (besides the builder's): %s\n",
		build.Image, build.ID, b.opts.ID, time.Now().UTC().Format(time.RFC3339), strings.Join(args, " "), strings.Join(b.config().LoggedEnv(di), " "))

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, BuildEnv+"="+b.buildTag(build.Image, build.ID))
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own, so the whole build can be killed, and a
	// signal to the command if this process dies, so a killed builder does
	// not leave builds running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(logf, "# nodepool: cannot start the command: %v\n", err)
		return nil, fmt.Errorf("cannot start dib-cmd %q: %w (install diskimage-builder, or set the image's dib-cmd)", args[0], err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var runErr error
	select {
	case runErr = <-waited:
	case <-ctx.Done():
		killTree(cmd.Process.Pid)
		<-waited
		cause := context.Cause(ctx)
		if errors.Is(cause, context.DeadlineExceeded) {
			cause = fmt.Errorf("%w: the build ran for %s; its processes were killed", errTimeout, di.BuildTimeout.D())
		}
		fmt.Fprintf(logf, "# nodepool: build stopped: %v\n", cause)
		return nil, cause
	}
	if runErr != nil {
		fmt.Fprintf(logf, "# nodepool: the command failed: %v\n", runErr)
		return nil, fmt.Errorf("%s failed (%v); last lines of %s: %s", args[0], runErr, build.Log, logTail(build.Log, 3))
	}
	files := map[string]string{}
	for _, f := range formats {
		path := output + "." + config.FormatExtension(f)
		if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
			fmt.Fprintf(logf, "# nodepool: the command did not write %s\n", path)
			return nil, fmt.Errorf("%s succeeded but did not write the %s file %s", args[0], f, path)
		}
		files[f] = path
	}
	fmt.Fprintf(logf, "# nodepool: build finished %s\n", time.Now().UTC().Format(time.RFC3339))
	return files, nil
}

// logTail returns the last n non-empty lines of a file, joined by " | ".
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(log unreadable)"
	}
	var lines []string
	for _, l := range bytes.Split(data, []byte("\n")) {
		if s := strings.TrimSpace(string(l)); s != "" && !strings.HasPrefix(s, "# nodepool:") {
			lines = append(lines, s)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// pruneLogs removes an image's oldest build logs so that
// build-log-retention remain besides the one a build is about to write.
func (b *Builder) pruneLogs(image string) {
	keep := *b.config().BuildLogRetention
	if keep < 0 {
		return
	}
	entries, err := os.ReadDir(b.opts.BuildLogDir)
	if err != nil {
		return
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(image) + `-[0-9]{10}\.log$`)
	var logs []string
	for _, e := range entries {
		if re.MatchString(e.Name()) {
			logs = append(logs, e.Name())
		}
	}
	slices.Sort(logs)
	for len(logs) > keep {
		if err := os.Remove(filepath.Join(b.opts.BuildLogDir, logs[0])); err != nil {
			b.log.Warn("could not remove an old build log", "log", logs[0], "err", err)
		}
		logs = logs[1:]
	}
}

// BuildEnv is set in the environment of every build's processes to
// "<image>-<build-id>@<run id>@<installation>", so that the processes of a
// build whose builder died can still be found and killed (on the same
// host), even when they left the build's process group. The installation
// (when the images bucket was created) keeps nodepools that share a host
// apart.
const BuildEnv = "NODEPOOL_BUILD"

func (b *Builder) buildTag(image, build string) string {
	return image + "-" + build + "@" + b.runID + "@" + b.install
}

// killTagged kills the processes (of this host) whose BuildEnv value
// matches, and returns how many it found.
func killTagged(match func(value string) bool) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(data, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte(BuildEnv+"=")); ok && match(string(v)) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				n++
				break
			}
		}
	}
	return n
}

// killBuildProcesses kills what is left of a build's processes on this
// host.
func (b *Builder) killBuildProcesses(image, build string) {
	prefix, suffix := image+"-"+build+"@", "@"+b.install
	if n := killTagged(func(v string) bool { return strings.HasPrefix(v, prefix) && strings.HasSuffix(v, suffix) }); n > 0 {
		b.log.Info("killed processes left by an orphaned build", "image", image, "build", build, "processes", n)
	}
}

// killEarlierRuns kills build processes left on this host by an earlier
// run of this process (same NODEPOOL_ID).
func (b *Builder) killEarlierRuns() {
	mine, suffix, now := "@"+b.opts.ID+"#", "@"+b.install, "@"+b.runID+"@"
	if n := killTagged(func(v string) bool {
		return strings.Contains(v, mine) && strings.HasSuffix(v, suffix) && !strings.Contains(v, now)
	}); n > 0 {
		b.log.Info("killed build processes left by an earlier run of this builder", "processes", n)
	}
}

// killTree kills a process, its process group and every descendant (some,
// like sudo with use_pty, start sessions of their own), with SIGKILL. The
// tree is read before anything is killed, while every process still has
// its parent.
func killTree(pid int) {
	tree := descendants(pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, p := range tree {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	// SIGKILL takes effect when each process next runs: wait (briefly)
	// until they are gone, so that a build recorded as stopped has no
	// process left.
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range tree {
		for running(p) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// running reports whether a process exists and is not a zombie.
func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && len(data) > i+2 && data[i+2] != 'Z' && data[i+2] != 'X'
}

// descendants lists every descendant of a process, from /proc.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentOf reads a process's parent from /proc/<pid>/stat.
func parentOf(pid int) (int, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces and parentheses; the fields after
	// the last ')' are: state ppid ...
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}
