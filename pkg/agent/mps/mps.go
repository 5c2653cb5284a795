// Package mps runs one MPS control daemon per MPS-mode GPU: each with its
// own pipe and log directories (so clients of one GPU never reach another's
// daemon, and a client's limits are its own, not daemon-wide), the compute
// mode MPS needs, default client limits, a health check through the control
// pipe every few seconds and whenever a daemon's control endpoint goes away,
// and a restart — reported — when a daemon dies. At each check it reads the
// limits back (verify.go) and restores, reported, any a client changed.
//
// It drives nvidia-cuda-mps-control through its documented interface only:
// `-d` starts the daemon, and commands go to it on the control program's
// stdin. Tests use a stand-in speaking the same interface
// (testdata/fakecontrol); nodes use the real binary.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// DefaultBinary is the MPS control program of NVIDIA's driver.
const DefaultBinary = "nvidia-cuda-mps-control"

// GPU is one MPS-mode GPU and its clients' defaults.
type GPU struct {
	UUID string
	// DefaultThreadPercentage caps a client that sets no limit of its own
	// (1–100). Tessera's clients always set theirs (the device plugin's
	// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); the default protects the GPU
	// from any other.
	DefaultThreadPercentage int
	// DefaultPinnedMemMiB is the default per-client memory limit; 0 leaves
	// it unset.
	DefaultPinnedMemMiB int64
}

// Config is what a Manager needs.
type Config struct {
	// Binary is the control program (DefaultBinary on a node).
	Binary string
	// Root holds <uuid>/pipe and <uuid>/log for every GPU.
	Root string
	GPUs []GPU
	// PrepareGPU puts a GPU in the compute mode MPS needs (exclusive
	// process) before its daemon starts; the agent passes NVML's.
	PrepareGPU func(uuid string) error
	// OnRestart is told of each daemon found dead and restarted (event and
	// metric in the agent).
	OnRestart func(uuid string, cause error)
	// OnTamper is told of limits found changed behind the agent's back (by
	// a client, through the control endpoint), before they are restored.
	OnTamper func(uuid string, drift []Drift)
}

// Manager runs the daemons.
type Manager struct {
	cfg Config

	mu       sync.Mutex
	restarts map[string]int
	// limits are each GPU's server limits as last set (SetServerLimits),
	// given again to a daemon that is restarted.
	limits map[string]gpu.MPSServerLimits
	// checkMu keeps a periodic check and one prompted by the pipe watch
	// from restarting a daemon twice.
	checkMu sync.Mutex
	// verified are the GPUs whose limits the last check read back as the
	// agent set them.
	verified map[string]bool
}

// New returns a manager; Start starts its daemons.
func New(cfg Config) *Manager {
	if cfg.Binary == "" {
		cfg.Binary = DefaultBinary
	}
	return &Manager{cfg: cfg, restarts: map[string]int{}, limits: map[string]gpu.MPSServerLimits{}, verified: map[string]bool{}}
}

// PipeDir is the pipe directory of a GPU's daemon, which the device plugin
// mounts into that GPU's MPS clients.
func (m *Manager) PipeDir(uuid string) string { return filepath.Join(m.cfg.Root, uuid, "pipe") }

// LogDir is the log directory of a GPU's daemon.
func (m *Manager) LogDir(uuid string) string { return filepath.Join(m.cfg.Root, uuid, "log") }

// Restarts says how many times a GPU's daemon was found dead and restarted.
func (m *Manager) Restarts(uuid string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restarts[uuid]
}

// Start prepares every GPU and starts its daemon with its defaults. A daemon
// already running (the agent restarted) is kept and given the defaults again.
func (m *Manager) Start(ctx context.Context) error {
	var errs []error
	for _, g := range m.cfg.GPUs {
		if err := m.start(ctx, g); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", g.UUID, err))
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) start(ctx context.Context, g GPU) error {
	for _, d := range []string{m.PipeDir(g.UUID), m.LogDir(g.UUID)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if m.cfg.PrepareGPU != nil {
		if err := m.cfg.PrepareGPU(g.UUID); err != nil {
			return fmt.Errorf("set compute mode for MPS: %w", err)
		}
	}
	if _, err := m.control(ctx, g.UUID, "get_server_list"); err != nil {
		out, err := m.run(ctx, g.UUID, "", "-d")
		if err != nil {
			return fmt.Errorf("start MPS daemon: %w: %s", err, out)
		}
	}
	cmds := []string{}
	if g.DefaultThreadPercentage > 0 {
		cmds = append(cmds, fmt.Sprintf("set_default_active_thread_percentage %d", g.DefaultThreadPercentage))
	}
	if g.DefaultPinnedMemMiB > 0 {
		// Device 0: the daemon sees only its own GPU.
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", g.DefaultPinnedMemMiB))
	}
	for _, c := range cmds {
		if out, err := m.control(ctx, g.UUID, c); err != nil {
			return fmt.Errorf("%s: %w: %s", c, err, out)
		}
	}
	m.mu.Lock()
	l, ok := m.limits[g.UUID]
	m.mu.Unlock()
	if ok {
		return m.applyServerLimits(ctx, g.UUID, l)
	}
	return nil
}

// SetServerLimits sets what a GPU's MPS server holds every client to: the
// daemon's defaults (for a server started later) and each running server's
// own limits. A client's CUDA_MPS_* variables can only lower them, so these
// are what a tenant that clears its variables gets; the agent sets the
// tightest values still correct for the GPU's tenants
// (gpu.MPSServerLimitsFor). A daemon restarted later gets them again.
//
// A running server's new limits apply to clients that connect afterwards;
// a client keeps the limits it connected with.
func (m *Manager) SetServerLimits(ctx context.Context, uuid string, l gpu.MPSServerLimits) error {
	m.mu.Lock()
	m.limits[uuid] = l
	m.mu.Unlock()
	return m.applyServerLimits(ctx, uuid, l)
}

// ServerLimits are a GPU's server limits as last set; ok is false before
// the first.
func (m *Manager) ServerLimits(uuid string) (gpu.MPSServerLimits, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.limits[uuid]
	return l, ok
}

func (m *Manager) applyServerLimits(ctx context.Context, uuid string, l gpu.MPSServerLimits) error {
	cmds := []string{fmt.Sprintf("set_default_active_thread_percentage %d", l.ThreadPercent)}
	if l.MemoryMiB > 0 {
		// Device 0: the daemon sees only its own GPU.
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", l.MemoryMiB))
	}
	servers, err := m.control(ctx, uuid, "get_server_list")
	if err != nil {
		return fmt.Errorf("GPU %s: get_server_list: %w: %s", uuid, err, servers)
	}
	for _, pid := range strings.Fields(servers) {
		cmds = append(cmds, fmt.Sprintf("set_active_thread_percentage %s %d", pid, l.ThreadPercent))
		if l.MemoryMiB > 0 {
			cmds = append(cmds, fmt.Sprintf("set_device_pinned_mem_limit %s 0 %dM", pid, l.MemoryMiB))
		}
	}
	for _, c := range cmds {
		if out, err := m.control(ctx, uuid, c); err != nil {
			return fmt.Errorf("GPU %s: %s: %w: %s", uuid, c, err, out)
		}
	}
	return nil
}

// Control sends one command to a GPU's daemon through the control program
// and returns its reply.
func (m *Manager) Control(ctx context.Context, uuid, command string) (string, error) {
	return m.control(ctx, uuid, command)
}

// control sends one command to a GPU's daemon through the control program.
func (m *Manager) control(ctx context.Context, uuid, command string) (string, error) {
	return m.run(ctx, uuid, command+"\n")
}

func (m *Manager) run(ctx context.Context, uuid, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.cfg.Binary, args...)
	cmd.Env = append(os.Environ(),
		"CUDA_VISIBLE_DEVICES="+uuid,
		"CUDA_MPS_PIPE_DIRECTORY="+m.PipeDir(uuid),
		"CUDA_MPS_LOG_DIRECTORY="+m.LogDir(uuid))
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// Check asks every daemon for its server list; a daemon that does not answer
// is started again, with its defaults, and reported.
func (m *Manager) Check(ctx context.Context) {
	for _, g := range m.cfg.GPUs {
		m.checkGPU(ctx, g, "")
	}
}

// checkGPU checks one daemon and restarts it when it does not answer; why
// says what prompted the check, for the report.
func (m *Manager) checkGPU(ctx context.Context, g GPU, why string) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	if ctx.Err() != nil {
		return // stopping: the daemons are being told to quit
	}
	out, err := m.control(ctx, g.UUID, "get_server_list")
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		m.ensure(ctx, g.UUID)
		return
	}
	m.setVerified(g.UUID, false)
	cause := fmt.Errorf("MPS daemon of GPU %s does not answer%s: %w: %s", g.UUID, why, err, out)
	if tail := lastLines(filepath.Join(m.LogDir(g.UUID), "control.log"), 5); tail != "" {
		cause = fmt.Errorf("%w; its control.log ends: %s", cause, tail)
	}
	logger := klog.FromContext(ctx)
	logger.Error(cause, "Restarting MPS daemon", "gpu", g.UUID)
	m.mu.Lock()
	m.restarts[g.UUID]++
	m.mu.Unlock()
	if m.cfg.OnRestart != nil {
		m.cfg.OnRestart(g.UUID, cause)
	}
	if err := m.start(ctx, g); err != nil {
		logger.Error(err, "MPS daemon restart failed; retrying at the next check", "gpu", g.UUID)
	}
}

// Ensure reads a GPU's limits back; limits found changed are reported
// (OnTamper) and restored. It reports whether they read back as the agent
// set them in the end: only then do the GPU's MPS slices count as held by
// the server.
func (m *Manager) Ensure(ctx context.Context, uuid string) bool {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	return m.ensure(ctx, uuid)
}

func (m *Manager) ensure(ctx context.Context, uuid string) bool {
	logger := klog.FromContext(ctx)
	drift, err := m.Verify(ctx, uuid)
	if err != nil {
		logger.Error(err, "MPS limits not verified; the GPU's MPS slices count as held only for cooperating clients", "gpu", uuid)
		m.setVerified(uuid, false)
		return false
	}
	if len(drift) == 0 {
		m.setVerified(uuid, true)
		return true
	}
	m.setVerified(uuid, false)
	if m.cfg.OnTamper != nil {
		m.cfg.OnTamper(uuid, drift)
	}
	if err := m.Restore(ctx, uuid); err != nil {
		logger.Error(err, "Restoring MPS limits failed; retrying at the next check", "gpu", uuid)
		return false
	}
	drift, err = m.Verify(ctx, uuid)
	ok := err == nil && len(drift) == 0
	m.setVerified(uuid, ok)
	return ok
}

func (m *Manager) setVerified(uuid string, ok bool) {
	m.mu.Lock()
	m.verified[uuid] = ok
	m.mu.Unlock()
}

// Verified reports whether a GPU's limits read back, at the last check, as
// the agent set them.
func (m *Manager) Verified(uuid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.verified[uuid]
}

// lastLines is the end of a log file, lines joined with " | ", or "".
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Run checks the daemons every interval until ctx ends, and a daemon at
// once when its control endpoint leaves its pipe directory. Every MPS client
// needs the pipe directory, control endpoint included (the CUDA driver asks
// the control daemon for its server), and the same endpoint takes the
// control program's commands, so any tenant can send `quit`: the daemon
// removes its endpoint as it exits, and the agent restarts it within
// milliseconds instead of at the next periodic check.
func (m *Manager) Run(ctx context.Context, every time.Duration) {
	removed := make(chan string, len(m.cfg.GPUs)+1)
	go func() {
		if err := m.watchPipes(ctx, removed); err != nil {
			klog.FromContext(ctx).Error(err, "Not watching the MPS pipe directories; a daemon that quits is restarted at the next periodic check")
		}
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	m.Check(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			m.Check(ctx)
		case uuid := <-removed:
			for _, g := range m.cfg.GPUs {
				if g.UUID == uuid {
					m.checkGPU(ctx, g, " (its control endpoint left the pipe directory: a client may have sent quit)")
				}
			}
		}
	}
}

// controlEndpoint is the name of the control daemon's endpoint in its pipe
// directory.
const controlEndpoint = "control"

// watchPipes sends a GPU's UUID to removed whenever its daemon's control
// endpoint is removed, until ctx ends (inotify on the pipe directories).
func (m *Manager) watchPipes(ctx context.Context, removed chan<- string) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	defer unix.Close(fd)
	byWatch := map[int32]string{}
	for _, g := range m.cfg.GPUs {
		wd, err := unix.InotifyAddWatch(fd, m.PipeDir(g.UUID), unix.IN_DELETE|unix.IN_MOVED_FROM)
		if err != nil {
			return fmt.Errorf("watch %s: %w", m.PipeDir(g.UUID), err)
		}
		byWatch[int32(wd)] = g.UUID
	}
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for ctx.Err() == nil {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 200); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		} else if n <= 0 {
			continue
		}
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if uuid, ok := byWatch[ev.Wd]; ok && name == controlEndpoint {
				select {
				case removed <- uuid:
				default:
				}
			}
		}
	}
	return nil
}

// TerminateClient asks a GPU's daemon to end one client process in every
// server it runs (terminate_client): MPS's own cleanup of the client's
// state, which preemption's reclaim asks for before it kills a leftover.
func (m *Manager) TerminateClient(ctx context.Context, uuid string, pid uint32) error {
	out, err := m.control(ctx, uuid, "get_server_list")
	if err != nil {
		return fmt.Errorf("GPU %s: get_server_list: %w: %s", uuid, err, out)
	}
	for _, server := range strings.Fields(out) {
		if out, err := m.control(ctx, uuid, fmt.Sprintf("terminate_client %s %d", server, pid)); err != nil {
			return fmt.Errorf("GPU %s: terminate_client %s %d: %w: %s", uuid, server, pid, err, out)
		}
	}
	return nil
}

// Stop tells every daemon to quit.
func (m *Manager) Stop(ctx context.Context) error {
	var errs []error
	for _, g := range m.cfg.GPUs {
		if out, err := m.control(ctx, g.UUID, "quit"); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: quit: %w: %s", g.UUID, err, out))
		}
	}
	return errors.Join(errs...)
}
