package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// clusterFlags are kubectl's flags for reaching a cluster (--kubeconfig,
// --context, --cluster, --user, --namespace, --server, --token, …) with its
// loading rules: --kubeconfig, else $KUBECONFIG, else ~/.kube/config.
type clusterFlags struct {
	rules     *clientcmd.ClientConfigLoadingRules
	overrides *clientcmd.ConfigOverrides
}

func bindClusterFlags(fs *pflag.FlagSet) *clusterFlags {
	c := &clusterFlags{rules: clientcmd.NewDefaultClientConfigLoadingRules(), overrides: &clientcmd.ConfigOverrides{}}
	fs.StringVar(&c.rules.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
	clientcmd.BindOverrideFlags(c.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	return c
}

// restConfig loads the configuration; with none to be found it says how to
// get a cluster rather than client-go's "try setting KUBERNETES_MASTER".
func (c *clusterFlags) restConfig() (*rest.Config, error) {
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(c.rules, c.overrides)
	cfg, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, fmt.Errorf("no cluster to read: no kubeconfig given with --kubeconfig, in $KUBECONFIG or at ~/.kube/config.\n" +
			"For a local GPU cluster, run `tessera up` in another terminal and pass the kubeconfig it prints (--kubeconfig FILE);\n" +
			"for a real cluster, point --kubeconfig or $KUBECONFIG at its kubeconfig")
	}
	return cfg, err
}

// checkOutput accepts the -o formats of commands whose output is data.
func checkOutput(format string) error {
	switch format {
	case "", "json", "yaml":
		return nil
	}
	return fmt.Errorf("-o %q: want json or yaml (or nothing, for a table)", format)
}

// printData writes v as JSON or YAML.
func printData(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
