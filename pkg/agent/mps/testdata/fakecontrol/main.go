// Command fakecontrol stands in for nvidia-cuda-mps-control in tests where
// no NVIDIA driver is present. It speaks the same interface:
//
//	fakecontrol -d       start the control daemon in the background and return
//	fakecontrol          read commands from stdin, send each to the daemon,
//	                     print its replies; fail when no daemon runs
//
// with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY from the
// environment. The daemon records every command it is told, one per line, in
// $CUDA_MPS_LOG_DIRECTORY/control.log, and answers get_server_list,
// get_default_active_thread_percentage, the set_default_* commands and quit.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	pipe, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipe == "" || logDir == "" {
		fmt.Fprintln(os.Stderr, "CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY must be set")
		os.Exit(2)
	}
	sock := filepath.Join(pipe, "control")
	switch {
	case len(os.Args) > 1 && os.Args[1] == "-d":
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			fmt.Fprintln(os.Stderr, "An instance of this daemon is already running")
			os.Exit(1)
		}
		cmd := exec.Command(os.Args[0], "--serve")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		ready, w, _ := os.Pipe()
		cmd.ExtraFiles = []*os.File{w}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		w.Close()
		buf := make([]byte, 1)
		if n, _ := ready.Read(buf); n != 1 {
			fmt.Fprintln(os.Stderr, "daemon failed to start")
			os.Exit(1)
		}
	case len(os.Args) > 1 && os.Args[1] == "--serve":
		serve(sock, logDir)
	default:
		client(sock)
	}
}

func serve(sock, logDir string) {
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		os.Exit(1)
	}
	_ = os.WriteFile(filepath.Join(filepath.Dir(sock), "fake.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644)
	logf, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		os.Exit(1)
	}
	ready := os.NewFile(3, "ready")
	_, _ = ready.Write([]byte{1})
	ready.Close()
	threads := "100"
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		line = strings.TrimSpace(line)
		fmt.Fprintln(logf, line)
		f := strings.Fields(line)
		reply := ""
		switch {
		case len(f) == 0:
		case f[0] == "get_server_list":
		case f[0] == "get_default_active_thread_percentage":
			reply = threads
		case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
			threads = f[1]
		case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3:
		case f[0] == "quit":
			fmt.Fprintln(c, "")
			c.Close()
			l.Close()
			_ = os.Remove(sock)
			return
		default:
			reply = "unknown command " + f[0]
		}
		fmt.Fprintln(c, reply)
		c.Close()
	}
}

func client(sock string) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, "Cannot find MPS control daemon process")
			os.Exit(1)
		}
		fmt.Fprintln(c, line)
		reply, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if r := strings.TrimSpace(reply); r != "" {
			fmt.Println(r)
		}
	}
}
