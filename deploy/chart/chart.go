// Package chart renders Tessera's Helm chart (deploy/chart/tessera) with the
// Helm library, as `helm template` would: the plain manifests under deploy/
// are generated from it, and its tests render, lint and dry-run it.
package chart

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader/archive"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-gpu/tessera/deploy"
)

// Files is the chart's directory.
//
//go:embed all:tessera
var Files embed.FS

// Load reads the embedded chart.
func Load() (*chartv2.Chart, error) {
	var files []*archive.BufferedFile
	err := fs.WalkDir(Files, "tessera", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := Files.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, &archive.BufferedFile{Name: strings.TrimPrefix(p, "tessera/"), Data: b})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return loader.LoadFiles(files)
}

// Options are what `helm template` takes besides values.
type Options struct {
	Namespace string // default tessera-system
	Release   string // default tessera
	// APIVersions the target cluster serves besides Kubernetes' own, as
	// `helm template --api-versions` takes them: "monitoring.coreos.com/v1/PrometheusRule".
	APIVersions []string
}

// Rendered is the chart's output: each template's text, by its path in the
// chart (templates/agent.yaml), empty ones left out.
type Rendered map[string]string

// Render renders the chart with values (nil: the defaults), checking them
// against values.schema.json first.
func Render(values map[string]any, o Options) (Rendered, error) {
	ch, err := Load()
	if err != nil {
		return nil, err
	}
	if o.Namespace == "" {
		o.Namespace = "tessera-system"
	}
	if o.Release == "" {
		o.Release = "tessera"
	}
	caps := common.DefaultCapabilities.Copy()
	caps.APIVersions = append(append(common.VersionSet{}, caps.APIVersions...), o.APIVersions...)
	vals, err := util.ToRenderValuesWithSchemaValidation(ch, values, common.ReleaseOptions{
		Name: o.Release, Namespace: o.Namespace, IsInstall: true, Revision: 1,
	}, caps, false)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	r := Rendered{}
	for name, text := range out {
		name = strings.TrimPrefix(name, ch.Name()+"/")
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(text) == "" {
			continue
		}
		r[name] = text
	}
	return r, nil
}

// Names lists the rendered templates in order.
func (r Rendered) Names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Objects is every template's output decoded into its objects, in the
// order Join gives.
func (r Rendered) Objects() ([]*unstructured.Unstructured, error) {
	all, err := r.Join()
	if err != nil {
		return nil, err
	}
	return deploy.Objects(all)
}

// Join is every template's output as one multi-document YAML stream.
func (r Rendered) Join(names ...string) (string, error) {
	if len(names) == 0 {
		names = r.Names()
	}
	var b strings.Builder
	for _, n := range names {
		text, ok := r[n]
		if !ok {
			return "", fmt.Errorf("the chart rendered nothing for %s", n)
		}
		if b.Len() > 0 {
			b.WriteString("---\n")
		}
		b.WriteString(strings.TrimLeft(text, "\n"))
		if !strings.HasSuffix(text, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}
