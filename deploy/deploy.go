// Package deploy embeds the shipped manifests, so that the playground runs
// the scheduler configuration and PriorityClasses a cluster would get.
package deploy

import _ "embed"

// SchedulerConfig is scheduler-config.yaml.
//
//go:embed scheduler-config.yaml
var SchedulerConfig string

// PriorityClasses is priorityclasses.yaml.
//
//go:embed priorityclasses.yaml
var PriorityClasses string
