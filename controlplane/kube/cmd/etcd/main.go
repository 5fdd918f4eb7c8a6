// Command etcd is the upstream etcd server, built from go.etcd.io/etcd/server/v3
// at the version pinned in go.mod. gpuproof's embedded cluster runs it on loopback.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
