// Package mpssim stands in for nvidia-cuda-mps-control where no NVIDIA
// driver is present: the MPS tests (through testdata/fakecontrol) and the
// playground's MPS-mode nodes (through `tessera mps-control`). It speaks the
// same interface as the real program:
//
//	<program> -d    start the control daemon in the background and return
//	<program>       read commands from stdin, send each to the daemon,
//	                print its replies; fail when no daemon runs
//
// with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY from the
// environment. The daemon records every command it is told, one per line, in
// $CUDA_MPS_LOG_DIRECTORY/control.log, and answers get_server_list (its
// own PID standing in for the one server), terminate_client,
// get_default_active_thread_percentage, the set_default_* commands, the
// per-server set_active_thread_percentage / set_device_pinned_mem_limit and
// their get_ twins, and quit. It keeps the limits as MPS documents them: a
// server's limits start from the defaults and are each client's ceiling.
// It also exits when its pipe directory is removed, so a simulated daemon
// never outlives the playground that started it.
package mpssim

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// serveFlag runs the daemon itself (what -d starts in the background).
const serveFlag = "--serve"

// Main runs the program with args and returns its exit code. self is the
// command that runs this program again (the daemon is started through it).
func Main(self []string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipe, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipe == "" || logDir == "" {
		fmt.Fprintln(stderr, "CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY must be set")
		return 2
	}
	sock := filepath.Join(pipe, "control")
	switch {
	case len(args) > 0 && args[0] == "-d":
		return daemonize(self, sock, stderr)
	case len(args) > 0 && args[0] == serveFlag:
		if err := serve(sock, logDir); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	default:
		return client(sock, stdin, stdout, stderr)
	}
}

func daemonize(self []string, sock string, stderr io.Writer) int {
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		fmt.Fprintln(stderr, "An instance of this daemon is already running")
		return 1
	}
	cmd := exec.Command(self[0], append(append([]string{}, self[1:]...), serveFlag)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	ready, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	w.Close()
	buf := make([]byte, 1)
	if n, _ := ready.Read(buf); n != 1 {
		fmt.Fprintln(stderr, "daemon failed to start")
		return 1
	}
	_ = cmd.Process.Release()
	return 0
}

func serve(sock, logDir string) error {
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(filepath.Dir(sock), "fake.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644)
	logf, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	ready := os.NewFile(3, "ready")
	_, _ = ready.Write([]byte{1})
	ready.Close()
	// Whoever removes the pipe directory ends the daemon.
	go func() {
		for range time.Tick(time.Second) {
			if _, err := os.Stat(sock); err != nil {
				l.Close()
				return
			}
		}
	}()
	threads, memLimit := "100", ""
	serverThreads, serverMem := "", ""
	pid := fmt.Sprint(os.Getpid())
	for {
		c, err := l.Accept()
		if err != nil {
			return nil
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		line = strings.TrimSpace(line)
		fmt.Fprintln(logf, line)
		f := strings.Fields(line)
		reply := ""
		switch {
		case len(f) == 0:
		case f[0] == "get_server_list":
			reply = pid
		case f[0] == "terminate_client" && len(f) == 3:
		case f[0] == "get_default_active_thread_percentage":
			reply = threads
		case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
			threads = f[1]
		case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3:
			memLimit = f[2]
		case f[0] == "get_default_device_pinned_mem_limit" && len(f) == 2:
			reply = memLimit
		case f[0] == "set_active_thread_percentage" && len(f) == 3 && f[1] == pid:
			serverThreads = f[2]
		case f[0] == "get_active_thread_percentage" && len(f) == 2 && f[1] == pid:
			reply = serverThreads
			if reply == "" {
				reply = threads
			}
		case f[0] == "set_device_pinned_mem_limit" && len(f) == 4 && f[1] == pid:
			serverMem = f[3]
		case f[0] == "get_device_pinned_mem_limit" && len(f) == 3 && f[1] == pid:
			reply = serverMem
			if reply == "" {
				reply = memLimit
			}
		case (f[0] == "set_active_thread_percentage" || f[0] == "set_device_pinned_mem_limit" ||
			f[0] == "get_active_thread_percentage" || f[0] == "get_device_pinned_mem_limit") && len(f) > 1 && f[1] != pid:
			reply = "Invalid server PID " + f[1]
		case f[0] == "quit":
			fmt.Fprintln(c, "")
			c.Close()
			l.Close()
			_ = os.Remove(sock)
			return nil
		default:
			reply = "unknown command " + f[0]
		}
		fmt.Fprintln(c, reply)
		c.Close()
	}
}

func client(sock string, stdin io.Reader, stdout, stderr io.Writer) int {
	in := bufio.NewScanner(stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Fprintln(stderr, "Cannot find MPS control daemon process")
			return 1
		}
		fmt.Fprintln(c, line)
		reply, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if r := strings.TrimSpace(reply); r != "" {
			fmt.Fprintln(stdout, r)
		}
	}
	return 0
}
