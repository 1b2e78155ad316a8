package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a started child process whose stdout is scanned for its listen line.
type proc struct {
	name string
	cmd  *exec.Cmd
	base string // "http://ADDR/v1", from the "listening on" line
}

var listenLine = regexp.MustCompile(`listening on (http://\S+/v1)`)

// start runs bin with env, sends its stderr to logPath, and waits for its "listening on" line.
func start(name, bin string, args, env []string, logPath string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close() // the child holds its own descriptor
	p := &proc{name: name, cmd: cmd}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case p.base = <-found:
		return p, nil
	case <-time.After(20 * time.Second):
		p.stop()
		logText, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%s did not print its listen line in 20 s; stderr:\n%s", name, logText)
	}
}

// stop sends SIGTERM and waits up to 5 s, then kills.
func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100 on every Linux
// architecture Go supports.
const clockTick = 10 * time.Millisecond

// cpuTime is the user plus system CPU time the process has used so far, from the kernel's own
// accounting of it (/proc/PID/stat: the same counters getrusage reports).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields we want come after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// After ")": state(3) ppid(4) ... utime is field 14, stime 15 (1-based in proc(5)).
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// syscalls is how many read- and write-family system calls the process has made so far
// (/proc/PID/io syscr + syscw: read, readv, pread and write, writev, pwrite, which Go's network
// I/O uses, not the socket calls recv and send). A read that finds nothing to read and makes the
// caller wait counts too.
func syscalls(pid int) (int64, error) {
	return procCounters(fmt.Sprintf("/proc/%d/io", pid), "syscr", "syscw")
}

// rss is the process's resident set size in bytes (VmRSS).
func rss(pid int) (int64, error) {
	kb, err := procCounters(fmt.Sprintf("/proc/%d/status", pid), "VmRSS")
	return kb << 10, err
}

// procCounters is the sum of the "key: value" lines of a /proc file with the given keys (a
// trailing unit such as " kB" dropped), each of which must be there.
func procCounters(path string, keys ...string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var n int64
	found := 0
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains(keys, k) {
			continue
		}
		num, _, _ := strings.Cut(strings.TrimSpace(v), " ")
		c, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: bad %s", path, k)
		}
		n += c
		found++
	}
	if found != len(keys) {
		return 0, fmt.Errorf("%s: not every one of %s", path, strings.Join(keys, ", "))
	}
	return n, nil
}
