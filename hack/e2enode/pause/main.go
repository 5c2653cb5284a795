// Command pause is the pod sandbox's one process for make e2e-node's node,
// built from source (CGO_ENABLED=0, static) rather than pulled: it waits for
// a signal to end and, as a pid namespace's first process, reaps orphans.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-children:
			for {
				var status syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
