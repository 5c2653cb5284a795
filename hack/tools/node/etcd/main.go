// Command etcd is etcd's own server (etcdmain), built at the version the
// project's in-process API server uses, for make e2e-node's control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
