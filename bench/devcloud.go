package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// devCloud is a nodepool-devcloud process the cloud scenario started: a
// cloud on loopback in a process of its own, as users run it, so that the
// product binary carries no simulator.
type devCloud struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
	// exports are the variables its first line of output exports.
	exports map[string]string
}

// startDevCloud runs `nodepool-devcloud args...` and waits for the line
// of exports it prints once it listens; its standard error goes to
// devcloud.log in workDir.
func startDevCloud(ctx context.Context, binary, workDir string, args ...string) (*devCloud, error) {
	if binary == "" {
		return nil, errors.New("the cloud scenario runs its cloud with nodepool-devcloud, which was not found beside nodepool or on PATH: build it (go build -o DIR/nodepool-devcloud ./cmd/nodepool-devcloud, DIR being nodepool's) or name it with --devcloud")
	}
	logPath := filepath.Join(workDir, "devcloud.log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = log.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	d := &devCloud{cmd: cmd, done: make(chan struct{}), log: log}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "export ") {
				select {
				case lines <- sc.Text():
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(d.done)
	}()
	select {
	case line := <-lines:
		d.exports = parseExports(line)
		return d, nil
	case <-d.done:
		_ = log.Close()
		return nil, fmt.Errorf("%s %s exited before it listened: %v (its log: %s)", binary, strings.Join(args, " "), cmd.ProcessState, logPath)
	case <-ctx.Done():
		d.stop()
		return nil, ctx.Err()
	}
}

// parseExports reads `export A=1 B='two words'`.
func parseExports(line string) map[string]string {
	out := map[string]string{}
	rest := strings.TrimPrefix(line, "export ")
	for rest != "" {
		rest = strings.TrimLeft(rest, " ")
		name, after, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		var val strings.Builder
		i := 0
		for i < len(after) && after[i] != ' ' {
			if after[i] == '\'' {
				end := strings.IndexByte(after[i+1:], '\'')
				if end < 0 {
					end = len(after) - i - 1
				}
				val.WriteString(after[i+1 : i+1+end])
				i += end + 2
				continue
			}
			if after[i] == '\\' && i+1 < len(after) {
				i++
			}
			val.WriteByte(after[i])
			i++
		}
		out[name] = val.String()
		rest = after[min(i, len(after)):]
	}
	return out
}

// stop ends the process (SIGTERM, then SIGKILL after ten seconds).
func (d *devCloud) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	_ = d.log.Close()
}

// get reads one of the dev cloud's own endpoints (/_devcloud/...) into v.
func getJSON(url string, v any) error {
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
