// Package mps runs one MPS control daemon per MPS-mode GPU: each with its
// own pipe and log directories (so clients of one GPU never reach another's
// daemon, and a client's limits are its own, not daemon-wide), the compute
// mode MPS needs, default client limits, a health check through the control
// pipe every few seconds, and a restart — reported — when a daemon dies.
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

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
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
}

// Manager runs the daemons.
type Manager struct {
	cfg Config

	mu       sync.Mutex
	restarts map[string]int
}

// New returns a manager; Start starts its daemons.
func New(cfg Config) *Manager {
	if cfg.Binary == "" {
		cfg.Binary = DefaultBinary
	}
	return &Manager{cfg: cfg, restarts: map[string]int{}}
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
	logger := klog.FromContext(ctx)
	for _, g := range m.cfg.GPUs {
		out, err := m.control(ctx, g.UUID, "get_server_list")
		if err == nil {
			continue
		}
		cause := fmt.Errorf("MPS daemon of GPU %s does not answer: %w: %s", g.UUID, err, out)
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
}

// Run checks the daemons every interval until ctx ends.
func (m *Manager) Run(ctx context.Context, every time.Duration) {
	wait.UntilWithContext(ctx, m.Check, every)
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
