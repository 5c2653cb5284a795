// Package apiservertest starts etcd and kube-apiserver in-process for a
// test (nothing downloaded), on loopback, stopped when the test ends: the
// real API server the integration tests and the binaries' tests run
// against.
package apiservertest

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/rest"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
)

// Start starts etcd and kube-apiserver with flags after its own and returns
// a client configuration for it. No controller-manager runs beside it, so
// the admission plugins that would wait on one are off: without the node
// lifecycle controller, the not-ready taint TaintNodesByCondition puts on
// a new Node would never be lifted, and without the token controller no
// service account would ever get its token.
func Start(t testing.TB, flags ...string) *rest.Config {
	t.Helper()
	etcd := testserver.NewTestConfig(t)
	testserver.RunEtcd(t, etcd)
	sc := storagebackend.NewDefaultConfig(fmt.Sprintf("/tessera-%d", time.Now().UnixNano()), nil)
	sc.Transport.ServerList = []string{etcd.ListenClientUrls[0].String()}
	srv := kubeapiservertesting.StartTestServerOrDie(t, kubeapiservertesting.NewDefaultTestServerOptions(),
		append([]string{"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition"}, flags...), sc)
	t.Cleanup(srv.TearDownFn)
	return rest.CopyConfig(srv.ClientConfig)
}
